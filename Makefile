# embnic — the two commands users need:  make demo   and   make test
PYTHON ?= python3
STEPS ?= 60
OUT ?= out/demo
NAME ?=
PMD ?=

.PHONY: all deps dataplane libs demo test clean fuzz bench

all: dataplane libs

deps:
	./scripts/install-deps.sh

# the card: embnic-dp, embnic-swx (DPDK)
dataplane: deps
	$(MAKE) -C dataplane

# the package's C libraries (the client's round, the shard's intake and answer path; no DPDK), built
# in place beside the Python that binds them, as `pip install -e .` does; a no-op when up to date
libs: deps
	$(PYTHON) setup.py -q build_ext --inplace

demo: dataplane libs
	$(PYTHON) -m embnic demo --steps $(STEPS) --out $(OUT)$(if $(NAME), --name $(NAME))$(if $(PMD), --pmd $(PMD))

test: dataplane libs
	$(PYTHON) -m pytest -q tests

fuzz: deps
	$(MAKE) -C dataplane fuzz

bench: dataplane libs
	$(PYTHON) -m embnic bench all --out out/bench

clean:
	$(MAKE) -C dataplane clean
	rm -rf out .deps-stamp build client_lib/*.so testbed/server/*.so

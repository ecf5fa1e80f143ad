# embnic — the two commands users need:  make demo   and   make test
PYTHON ?= python3
STEPS ?= 60
OUT ?= out/demo
NAME ?=
PMD ?=

.PHONY: all deps dataplane demo test clean fuzz bench p4tools

all: dataplane

deps:
	./scripts/install-deps.sh

dataplane: deps
	$(MAKE) -C dataplane

demo: dataplane
	$(PYTHON) -m embnic demo --steps $(STEPS) --out $(OUT)$(if $(NAME), --name $(NAME))$(if $(PMD), --pmd $(PMD))

test: dataplane
	$(PYTHON) -m pytest -q tests

fuzz: deps
	$(MAKE) -C dataplane fuzz

bench: dataplane
	$(PYTHON) -m embnic bench all --out out/bench

# the P4 tools (p4c, BMv2 with Thrift and P4Runtime) at pinned versions, built from source into
# PREFIX; never part of demo/test. SRC: a URL base or a folder of git mirrors; P4C_BACKENDS=bmv2,dpdk;
# PARTS=p4c,pi,bmv2 (p4/README.md, "Compile and run")
p4tools:
	PREFIX="$(PREFIX)" SRC="$(SRC)" P4C_BACKENDS="$(P4C_BACKENDS)" PARTS="$(PARTS)" JOBS="$(JOBS)" \
	    ./scripts/build-p4tools.sh

clean:
	$(MAKE) -C dataplane clean
	rm -rf out .deps-stamp

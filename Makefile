# embnic — the two commands users need:  make demo   and   make test
PYTHON ?= python3
STEPS ?= 60
OUT ?= out/demo
NAME ?=
PMD ?=

.PHONY: all deps dataplane demo test clean fuzz bench

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

clean:
	$(MAKE) -C dataplane clean
	rm -rf out .deps-stamp

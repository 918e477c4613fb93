# dxopt: the two set-up commands are `make demo` and `make test`.
# Torch is pinned to the CPU wheel; override with `make test TORCH="torch==2.x.y"`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTEST_ARGS ?=
# two pytest-xdist workers (one per core of the CI machine), one torch thread each; WORKERS=0 runs in one process
WORKERS ?= 2

.PHONY: demo test lint format bench bench-peers venv clean
QPTH_BUILD ?= /tmp/dxopt-qpth-build

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# One stamp per extras set, refreshed when pyproject.toml changes. The demo's install step
# also compiles (or loads) the QP kernels (dxopt.qp.warmup), so the demo's first call is fast.
$(VENV)/.installed-%: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$*]" "$(TORCH)"
	if [ "$*" = demo ]; then $(PY) -c "import dxopt.qp; dxopt.qp.warmup(verbose=True)"; fi
	touch $@

venv: $(VENV)/.installed-dev

demo: $(VENV)/.installed-demo
	$(VENV)/bin/dxopt demo portfolio

test: $(VENV)/.installed-dev
	if [ "$(WORKERS)" = 0 ]; then par=""; threads=2; else par="-n $(WORKERS) --dist loadfile"; threads=1; fi; \
	OMP_NUM_THREADS=$$threads $(PY) -m pytest -q $$par $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks examples docs
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs
	$(VENV)/bin/mypy

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff format src tests benchmarks examples docs
	$(VENV)/bin/ruff check --fix src tests benchmarks examples docs

# qpth 0.0.18 (a benchmark peer) ships only an sdist that current setuptools cannot build:
# build its wheel in a throwaway venv with old setuptools, then install it without its
# (outdated numpy<2) dependency pins.
bench-peers: $(VENV)/.installed-bench
	$(PY) -c "import qpth" 2>/dev/null || ( rm -rf $(QPTH_BUILD) && \
	  $(PYTHON) -m venv $(QPTH_BUILD) && \
	  $(QPTH_BUILD)/bin/pip install -q "setuptools<60" wheel && \
	  $(QPTH_BUILD)/bin/pip wheel -q --no-deps --no-build-isolation -w $(QPTH_BUILD)/wheels qpth==0.0.18 && \
	  $(PIP) install -q --no-deps $(QPTH_BUILD)/wheels/qpth-0.0.18-py3-none-any.whl )

bench: bench-peers
	$(VENV)/bin/dxopt bench all

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

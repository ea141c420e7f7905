# Set-up and entry points. `make demo` and `make test` install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
THREADS ?= 2

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false
# BBH has no PyPI source: use the copy beside the checkout when there is one (CI has it).
SHARED_BBH := $(abspath ../shared/data/bbh)
export ENSBENCH_BBH_DIR ?= $(if $(wildcard $(SHARED_BBH)/*.json),$(SHARED_BBH),)

.PHONY: install demo test test-fast bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

demo: install
	$(BIN)/ensbench run recipes/offline/demo.yaml --threads $(THREADS)

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not integration"

bench: install
	$(BIN)/python scripts/bench_member_vs_hflm.py --threads 1
	$(BIN)/python scripts/bench_methods.py --threads 1

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

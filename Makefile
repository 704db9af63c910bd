# Two user-facing targets: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU machines this project is developed on carry torch 2.13.0 as a local CPU wheel; on a GPU
# machine the same pin resolves to the CUDA build from PyPI.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,server,ray

.PHONY: setup demo test lint

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	$(PY) -m pipecat_nemotron.demo

test: setup
	$(PY) -m pytest -q -ra

lint: setup
	$(VENV)/bin/ruff check pipecat_nemotron tests examples bots scripts

# Two user-facing targets: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU machines this project is developed on carry torch 2.13.0 as a local CPU wheel; on a GPU
# machine the same pin resolves to the CUDA build from PyPI.
TORCH_SPEC ?= torch==2.13.0
# llm-local builds llama.cpp from source on the first install (minutes; pip caches the wheel in ~/.cache/pip).
EXTRAS ?= dev,server,ray,riva,llm-local

# System packages the browser and eval tests use: Chromium (driven by Playwright, no browser download), espeak-ng
# and sox (test speech), iproute2/util-linux (a loopback-only network namespace). Installed when root with apt.
SYSTEM_PACKAGES := chromium espeak-ng sox iproute2 util-linux
SYSTEM_BINARIES := /usr/bin/chromium espeak-ng sox ip unshare

.PHONY: setup demo test lint system-deps

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" || { \
		echo "*** Installing failed. If the error above is llama-cpp-python's build (the llm-local extra builds"; \
		echo "*** llama.cpp from source): install a C++ compiler and cmake (sudo apt-get install build-essential"; \
		echo "*** cmake), or leave the extra out (make EXTRAS=dev,server,ray,riva ...) and point NEMOTRON_LLM_BASE_URL"; \
		echo "*** in .env at your own OpenAI-compatible server (docs/LLM.md)."; exit 1; }
	touch $@

demo: setup
	$(PY) -m pipecat_nemotron.demo

# The suite on TEST_WORKERS pytest-xdist workers (whole files per worker, one torch thread each), then the
# `serial` tests (real-time sessions that need a quiet CPU, Ray clusters) alone, after ruff and the import-linter
# contracts. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup system-deps
	@status=0; \
	$(VENV)/bin/ruff check pipecat_nemotron tests examples bots scripts || status=$$?; \
	$(VENV)/bin/lint-imports --no-cache || status=$$?; \
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile -m "not serial" || status=$$?; \
	$(PY) -m pytest -q -ra -m serial || status=$$?; \
	exit $$status

system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing system packages for the browser and eval tests:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	else \
		echo "*** Missing:$$missing. Install: sudo apt-get install $(SYSTEM_PACKAGES)"; \
		echo "*** Until then the browser tests are SKIPPED (pytest -ra lists them)."; \
	fi

# Ruff (SLF001 included: no reach into another module's privates) and the import-linter layers (pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check pipecat_nemotron tests examples bots scripts
	$(VENV)/bin/lint-imports --no-cache

# The two commands a new machine needs (see README.md):
#   make setup   virtualenv .venv with onnx-remat and its test extras, plus graphviz and chromium
#   make test    the test suite (slow benchmarks are skipped; `make test-all` runs them too)
#   make lint    ruff and mypy (CI runs it too)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv

.PHONY: setup test test-all lint

setup:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	@./.ci/system-packages

test:
	$(VENV)/bin/python -m pytest

test-all:
	$(VENV)/bin/python -m pytest -m ''

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

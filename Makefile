# The two commands a new machine needs (see README.md):
#   make setup   virtualenv .venv with onnx-remat and its test extras, plus graphviz and chromium
#   make test    the test suite (slow benchmarks are skipped; `make test-all` runs them too)
#   make lint    ruff and mypy (CI runs it too)
#   make readme  rewrite README.md's example outputs from a real run (tests/test_readme.py checks them)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv

.PHONY: setup test test-all lint readme

# One line per step: the install takes minutes on a fresh machine (torch, onnxruntime-training),
# and pip's -q would otherwise leave the terminal silent all that time.
setup:
	@echo "setup 1/4: virtualenv $(VENV) ($(PYTHON))"
	$(PYTHON) -m venv $(VENV)
	@echo "setup 2/4: upgrading pip"
	$(VENV)/bin/python -m pip install -q --upgrade pip
	@echo "setup 3/4: onnx-remat and its test extras (torch CPU, onnxruntime-training, ...; a few minutes the first time)"
	$(VENV)/bin/python -m pip install -q --progress-bar off -e '.[test]'
	@echo "setup 4/4: system packages (graphviz, chromium)"
	@./.ci/system-packages
	@echo "setup done: make test runs the tests"

test:
	$(VENV)/bin/python -m pytest

test-all:
	$(VENV)/bin/python -m pytest -m ''

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

readme:
	$(VENV)/bin/python tests/readme_replay.py --update

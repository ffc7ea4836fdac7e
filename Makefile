# Two entry points on a fresh machine with Python 3.11 and pip:
#   make demo   set up, then run the elastic demo on the embedded cluster
#   make test   set up, then lint and run the whole test suite
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test lint demo bench lock clean

$(BIN)/.installed: requirements/dev.lock pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --require-hashes -r requirements/dev.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

setup: $(BIN)/.installed

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest

demo: setup
	$(BIN)/reslice demo

bench: setup
	$(BIN)/python -m bench

# Regenerate the lock files after changing pyproject.toml (needs uv: pip install uv).
lock:
	uv pip compile pyproject.toml --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header --annotation-style line -o requirements/dev.lock
	uv pip compile pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header --annotation-style line -o requirements/run.lock
	uv pip compile pyproject.toml --extra tpu --python-version 3.11 --python-platform x86_64-manylinux_2_31 --generate-hashes --no-header --annotation-style line -o requirements/tpu.lock

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

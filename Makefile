# One way to do each thing. Every target sets up what it needs first.
#   make build   venv + prove + generate C + compile + table check + identity  (build/accept/)
#   make test    build + the whole CPU test suite
#   make serve   build + default model assets + server on the embedded default (CPU, SmolLM2)
#   make bench   the GPU benchmark (needs a CUDA machine with the gpu extra)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup build prove test lint serve bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

prove: $(STAMP)
	$(BIN)/elpis prove

build: $(STAMP)
	$(BIN)/elpis build

lint: $(STAMP)
	$(BIN)/ruff check elpis tests ext

test: build lint
	$(BIN)/python -m pytest -m "not gpu" --durations=25 $(PYTEST_ARGS)

serve: build
	$(BIN)/elpis serve

bench: build
	$(BIN)/elpis bench

clean:
	rm -rf build .pytest_cache .ruff_cache

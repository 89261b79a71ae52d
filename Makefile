# One way to do each thing. Every target sets up what it needs first.
#   make build   venv + prove + generate C + compile + table check + identity  (build/accept/)
#   make test    build + the whole CPU test suite
#   make serve   build + default model assets + server on the embedded default (CPU, SmolLM2)
#   make bench   the GPU benchmark: the gpu extra, synthetic exact-shape checkpoints made once (or existing
#                BENCH_MODEL=... BENCH_DRAFT=... for real ones), stock vs elpis into bench/results/ (elpis bench engine)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers: the CI machine's two cores (a module's tests share a worker and its fixtures)
TEST_WORKERS ?= 2
SYNTH_DIR   := .cache/bench
BENCH_MODEL ?= $(SYNTH_DIR)/target
BENCH_DRAFT ?= $(SYNTH_DIR)/draft
BENCH_ARGS ?=

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
	$(BIN)/python -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS)

serve: build
	$(BIN)/elpis serve

# The synthetic checkpoints (the defaults) are made once, written beside their place and moved in whole, so an
# interrupted run leaves none; a model named by BENCH_MODEL / BENCH_DRAFT must exist (never synthesised).
bench: build
	$(BIN)/pip install --quiet -e '.[gpu]'
	@if [ ! -d "$(BENCH_MODEL)" ]; then \
		case "$(BENCH_MODEL)" in $(SYNTH_DIR)/*) ;; *) echo "make bench: no model $(BENCH_MODEL)" >&2; exit 2;; esac; \
		rm -rf "$(BENCH_MODEL).partial" && $(BIN)/elpis synth --full "$(BENCH_MODEL).partial" \
		&& mv "$(BENCH_MODEL).partial" "$(BENCH_MODEL)"; fi
	@if [ ! -d "$(BENCH_DRAFT)" ]; then \
		case "$(BENCH_DRAFT)" in $(SYNTH_DIR)/*) ;; *) echo "make bench: no draft $(BENCH_DRAFT)" >&2; exit 2;; esac; \
		rm -rf "$(BENCH_DRAFT).partial" && $(BIN)/elpis synth --draft "$(BENCH_DRAFT).partial" \
		&& mv "$(BENCH_DRAFT).partial" "$(BENCH_DRAFT)"; fi
	$(BIN)/elpis bench engine --model $(BENCH_MODEL) --draft $(BENCH_DRAFT) $(BENCH_ARGS)

clean:
	rm -rf build .pytest_cache .ruff_cache

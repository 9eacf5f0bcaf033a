# `make demo` and `make test` set up .venv from scratch when needed; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch that lies on these machines; override for a CUDA machine, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.stepwatch-installed
SPEEDUPS := $(VENV)/.stepwatch-speedups

.PHONY: setup demo test lint docs bench bench-valgrind clean

$(STAMP): pyproject.toml Makefile
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,demo,docs]"
	touch $(STAMP)
	touch $(SPEEDUPS)  # the editable install has just built them

# the C speedups, rebuilt in place when their source changes (the install builds them too); where they cannot
# be built, stepwatch runs its pure-Python blocks and this says why
$(SPEEDUPS): $(STAMP) $(wildcard src/stepwatch/*.c) hatch_build.py
	-$(BIN)/python hatch_build.py
	touch $(SPEEDUPS)

setup: $(STAMP) $(SPEEDUPS)

demo: setup
	$(BIN)/stepwatch demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# the documentation site from docs/ (MkDocs, Material theme); --strict: a broken link, anchor or page fails it
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint docs
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/workers.py
	$(BIN)/python benchmarks/auto.py
	$(BIN)/python benchmarks/interleaved.py
	$(BIN)/python benchmarks/interleaved.py --fillers 0 --run-length 8 --skip 4 --repeats 200 \
		--ways "by hand,plain again,ten us known" --out benchmarks/results/interleaved_runs.json
	$(BIN)/python benchmarks/interleaved.py --fillers 0 --run-length 8 --skip 4 --repeats 200 \
		--ways "by hand,floor,plain again" --out benchmarks/results/interleaved_floor.json
	$(BIN)/python benchmarks/interleaved.py --fillers 0 --run-length 16 --skip 8 --repeats 200 \
		--ways "by hand,floor,plain again" --out benchmarks/results/interleaved_floor_16.json
	$(BIN)/python benchmarks/scaling.py
	$(BIN)/python benchmarks/gather.py
	$(BIN)/python benchmarks/live.py

# what a step executes and the cache lines it touches, counted by Valgrind (needs valgrind; about 45 minutes on 2 cores)
bench-valgrind: setup
	$(BIN)/python benchmarks/instructions.py
	$(BIN)/python benchmarks/in_situ.py
	$(BIN)/python benchmarks/footprint.py
	$(BIN)/python benchmarks/footprint.py --module-calls 6 --collector paused --out benchmarks/results/footprint_6_calls.json
	$(BIN)/python benchmarks/footprint.py --module-calls 514 --collector paused --out benchmarks/results/footprint_514_calls.json
	$(BIN)/python benchmarks/footprint.py --phases --collector paused

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

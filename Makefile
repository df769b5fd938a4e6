# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pip takes torch 2.13.0 (CPU) from this machine's disk; bring your own CUDA build with
# e.g. `make test TORCH_SPEC="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"`.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.speedpack-installed
# LitData and MosaicML streaming for the invisibility grid, without their torchvision requirement
# (a CUDA torch from the registry); their other requirements come with the dev extra.
STACKS_SPEC ?= litdata==0.2.76 mosaicml-streaming==0.13.0
DEMO_OUT ?= demo-output
GPU_CHECK_OUT ?= gpu-check-output

# A second venv with pytorch-lightning only (no `lightning`): proves the package imports and fits
# with one namespace installed.
PL_ONLY_VENV ?= .venv-pl-only
PL_ONLY_STAMP := $(PL_ONLY_VENV)/.speedpack-installed

.PHONY: setup test test-all test-rest test-grid lint typecheck pytest pytest-rest test-one-namespace \
	test-versions demo bench bench-check bench-check-stable gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Torch first (a bare `torch` requirement would pull a multi-GB CUDA build), then the package.
$(STAMP): pyproject.toml | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install $(TORCH_SPEC)
	$(BIN)/python -m pip install -e ".[all,dev]"
	$(BIN)/python -m pip install --no-deps $(STACKS_SPEC)
	@touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# `make test`: the fast, deterministic tests (<= 10 minutes on a 2-core machine). The rest (marked
# slow, ddp, browser, and the whole grid) run in `make test-all`, which CI runs.
FAST_TESTS := not slow and not ddp and not browser and not grid
# The slow tests and the grid run on this many pytest-xdist workers: each test is a subprocess or
# two that keep about one core busy, so on 2 cores two at a time took 0.65 of the time (22.5 min
# against 34.8 for the slow tests).
# `make test-rest TEST_WORKERS=0` runs them one at a time. Each test file stays on one worker
# (its tests may share a fixture or a key); the grid's cases go by (stack, workers) group, so a
# setting's plain run is made once.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
# CI's log then says where its 90 minutes went (the slowest tests of each run).
DURATIONS := --durations=15

pytest: setup
	$(BIN)/python -m pytest -m "$(FAST_TESTS)"

pytest-rest: setup
	$(BIN)/python -m pytest -p no:cacheprovider -m "(slow or ddp or browser) and not grid" \
		$(XDIST) $(if $(XDIST),--dist loadfile) $(DURATIONS)

$(PL_ONLY_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PL_ONLY_VENV)
	@$(PL_ONLY_VENV)/bin/python -c "import torch" 2>/dev/null || $(PL_ONLY_VENV)/bin/python -m pip install $(TORCH_SPEC)
	$(PL_ONLY_VENV)/bin/python -m pip install -e . "pytest>=8" "pytest-timeout>=2.2"
	@! $(PL_ONLY_VENV)/bin/python -c "import lightning" 2>/dev/null || (echo "lightning must not be installed in $(PL_ONLY_VENV)"; exit 1)
	@touch $(PL_ONLY_STAMP)

test-one-namespace: $(PL_ONLY_STAMP)
	$(PL_ONLY_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_one_namespace.py tests/test_contract.py

test: lint typecheck pytest test-one-namespace

# Everything `make test` leaves out: slow, DDP and browser tests (the grid's fast cases among them),
# the memory and count bounds of benchmarks/bounds.toml, and the grid less those fast cases.
test-rest: pytest-rest bench-check-stable
	SPEEDPACK_GRID_SKIP_FAST=1 $(MAKE) test-grid

test-all: test test-rest test-versions

# The Lightning-facing fast tests on the oldest and the newest stack the package claims, each in
# its own venv under .venv-versions/ (reused while its pins match): `make test-versions
# VERSIONS=oldest` runs one. CI runs `oldest` (the newest, torch 2.15.0, is a ~3 GB CUDA build from
# the registry).
VERSIONS ?=
test-versions:
	$(PYTHON) tests/versions/run_versions.py $(VERSIONS)

# The full "invisible to the job" grid (stacks x workers x pack modes, 97 cases; 109 of the 119
# it had took 25 min here on two workers, less `make test`'s 10); `make test-rest` runs it
# with SPEEDPACK_GRID_SKIP_FAST=1, after pytest-rest ran its fast cases (marked slow).
test-grid: setup
	$(BIN)/python -m pytest -p no:cacheprovider -m grid tests/test_invisible.py \
		$(XDIST) $(if $(XDIST),--dist loadgroup) $(DURATIONS)

demo: setup
	$(BIN)/python examples/demo.py --out $(DEMO_OUT)

bench: setup
	$(BIN)/python benchmarks/run_all.py

# Each headline figure against its bound (benchmarks/bounds.toml); run it before you stop.
bench-check: setup
	$(BIN)/python benchmarks/bench_check.py

# The memory and count bounds only: stable on a loaded machine, so CI runs them.
bench-check-stable: setup
	$(BIN)/python benchmarks/bench_check.py --stable

# On a GPU machine: no venv, no install; the repository and the machine's own torch, Lightning and
# nvidia-ml-py (see BENCHMARKS.md, "On a GPU"). Without CUDA it runs dry (CPU, toy sizes).
gpu-check:
	PYTHONPATH=. $(PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT)

clean:
	rm -rf $(VENV) $(PL_ONLY_VENV) $(DEMO_OUT) .pytest_cache .mypy_cache .ruff_cache

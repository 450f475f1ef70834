# raycl — `make demo` sets up .venv and runs the GEC sweep on an embedded local Ray; `make test` is CI's command.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.raycl-installed
SPACE  ?= gec_pd
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: install test test-cluster test-gpu gpu-check test-equivalence mutate mutate-units lint docs dist demo bench clean

install: $(STAMP)

# torch first, pinned: 2.13.0 is the CPU build on this machine's disk; an unpinned torch would pull CUDA (GBs).
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check raycl tests bench
	$(VENV)/bin/ruff format --check raycl tests bench
	$(VENV)/bin/mypy

# pytest in TEST_WORKERS processes (pytest-xdist; 1: one process): whole files dealt to them, tests/conftest.py's
# LONGEST_FIRST files first; each worker has its own local Ray and temporary folders
TEST_WORKERS ?= 2
test: lint
	$(VENV)/bin/pytest -q --durations=15 -m "not cluster" $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) tests

# a 2-node Ray cluster of `ray start` processes on localhost (token auth on) and raycl jobs through its job server
# (about 2 minutes on 2 cores; .ci/run runs it after `make test`)
test-cluster: install
	$(VENV)/bin/pytest -q -m cluster tests

# the tests marked gpu (skipped without CUDA); on a GPU machine without the venv: python3 -m pytest -m gpu tests
test-gpu: install
	$(VENV)/bin/pytest -q -m gpu tests

# on a GPU machine, within 10 minutes: the GPU tests, bench/train.py, each recipe's smoke training at bf16, a run
# sharing one GPU, GPU mining; one JSON summary and bench/README.md's "Measured on a GPU" rows. No venv needed:
# the venv's Python if there is one, else python3; parts whose packages are missing are skipped and named.
# One part: make gpu-check PART=smoke-gec (bench/gpu_check.py --help lists them)
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PY) bench/gpu_check.py $(if $(PART),--part $(PART))

# 2 Ray Train workers (gloo) against 1 worker, for every recipe (also part of `make test`)
test-equivalence: install
	$(VENV)/bin/pytest -q -m equivalence tests

# plants each bug of bench/mutate.py's list in a copy of the tree and runs the tests that concern it (not in `make test`)
mutate: install
	$(PY) bench/mutate.py

# the documentation site (MkDocs, Material theme) into site/; --strict: a broken link or anchor, a docstring
# mkdocstrings cannot read or a generated part that fails (docs/_hooks/reference.py) fails the build. Offline.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# operator mutation (mutmut) of the pure modules — losses, token batching, schedules, memory, adversarial steps, the
# miners' selection, false negatives, metrics, config validation — each mutant against the unit tests that call its
# function; writes runs/mutate-units.json and one summary line (not in `make test`). MODULES=optim,feeds: only the
# files of pyproject's [tool.mutmut] only_mutate whose path contains one of the words
MODULES ?=
mutate-units: install
	$(PY) bench/mutate_units.py $(if $(MODULES),--modules $(MODULES))

# the package as an index would hold it: the sdist and the wheel (python -m build, isolated: pyproject's build
# requirements alone; the wheel built from the sdist), their metadata (twine check --strict), then the wheel installed
# in a fresh venv outside the checkout (torch==2.13.0 first, not editable) and run from a folder elsewhere: every tune
# space loads from the package, `raycl` lists its verbs, a one-epoch training runs, the extras resolve
# (bench/dist_check.py: about 5 minutes on 2 cores). .ci/run runs it.
dist: install
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*
	$(PY) bench/dist_check.py dist/*.whl

demo: install
	$(PY) -m raycl.tune $(SPACE) --preset smoke

clean:
	rm -rf runs site mutants dist build .pytest_cache .mypy_cache .ruff_cache

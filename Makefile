# posenc: the book and the package. `make book` and `make test` are all a fresh clone needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard book/*.ipynb))

# Python may cache the bytecode of the package, the tests and the tools (in their gitignored __pycache__/) even
# where the environment says not to (PYTHONDONTWRITEBYTECODE=1, common in containers): every test worker, notebook
# kernel and subprocess imports them, and without the cache each one compiles them again (a worker's collection
# of the suite: 16.2 s without it, 11.7-12.2 s with it, measured here).
unexport PYTHONDONTWRITEBYTECODE

# Parallel test workers (pytest-xdist): one per CPU core by default; `make test TEST_JOBS=1` runs serially.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# torch threads per test worker: the workers already fill the cores (measured on 2 cores: 227 s with one thread
# each, 249 s with torch's default of one per core). `make test-portable` also runs the notebooks at the default.
TEST_THREADS ?= $(if $(filter 1,$(TEST_JOBS)),$(shell nproc 2>/dev/null || echo 1),1)
# JupyterLab refuses to start as root without --allow-root (containers often run as root).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: help venv book test test-deploy census test-fast test-time test-portable test-floor notebooks export check-export lint lab bench experiment context-experiment gpu-check clean

help:
	@echo "make help           this list"
	@echo "make venv           create .venv from requirements.txt (every other target does it when missing)"
	@echo "make book           build the HTML book into _build/html (warnings are errors); open _build/html/index.html"
	@echo "make test           tests/ and every notebook under nbval, in parallel (TEST_JOBS=$(TEST_JOBS)); builds the book first"
	@echo "make test-deploy    the slow deployment paths: ONNX through onnxruntime and AOTInductor packages (needs g++)"
	@echo "make census         every transformers family with a rotary module, built tiny, swapped, compared"
	@echo "make test-fast      tests/ only, no notebooks and no book build, stopping at the first failure"
	@echo "make test-time      time 'make test' (and its parts) on this machine -> benchmarks/results/test-time-*.json"
	@echo "make test-portable  the notebooks under ATEN_CPU_CAPABILITY=default, then OMP_NUM_THREADS=1"
	@echo "make test-floor     the wheel with the oldest supported torch, in a clean venv"
	@echo "make notebooks      re-execute the notebooks in place, storing their outputs (NB=book/NN_name.ipynb for one)"
	@echo "make export         regenerate posenc/ from the notebooks' exported cells"
	@echo "make check-export   report drift between the notebooks and posenc/ (exit 1 when they differ)"
	@echo "make lint           ruff on the package, tests, tools and notebooks"
	@echo "make lab            JupyterLab on book/ with the project's environment (LAB_ARGS='$(LAB_ARGS)')"
	@echo "make bench          time posenc against the classic recipes, Hugging Face rotary (and the swap into a Llama), diffusers and the copy bandwidth; peak memory -> benchmarks/results/"
	@echo "make experiment     train tiny transformers with each positional scheme (70 min on 2 cores for the committed results; resumes if stopped) -> experiments/results/"
	@echo "make context-experiment  a byte-level model of mpmath's source trained at L = 64, then every rope scaling at 1-8 L, zero-shot and fine-tuned (5 seeds) -> experiments/results/"
	@echo "make gpu-check      on a CUDA machine (plain python3 with torch and pytest): GPU tests + benchmark"
	@echo "make clean          remove the built book and caches"

venv: $(STAMP)

# Created when missing, refreshed when the pins change. The pins are for Python 3.11 or newer (several pinned
# packages, numpy among them, have no release for older Pythons): check first, and say what is needed.
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "posenc's pinned environment needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>&1)."; \
	  echo "Install one (e.g. python3.11) and run: make PYTHON=python3.11 $(MAKECMDGOALS)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -r requirements-nodeps.txt
	@# the repository root on the venv's path, so that the chapters (in nbval's kernels, `make lab`, `make notebooks`)
	@# import the reference implementations as `tests.references` without editing sys.path
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'posenc-repository.pth').write_text('$(CURDIR)\n')"
	@touch $(STAMP)

# The last good build, and what the book is built from (the pages, their extensions and static files, the
# package for the API page, the experiment's code that chapter 08 includes, the configuration): `make book` runs
# jupyter-book only when one of them is newer than the last good build (an unchanged book: no 7 s Sphinx start).
BOOK_STAMP := _build/html/.posenc-built
BOOK_INPUTS := _config.yml _toc.yml $(shell find book posenc experiments/position experiments/context experiments/results/context-extension-cpu.json -type f \
  -not -path '*/.ipynb_checkpoints/*' -not -path '*/__pycache__/*' 2>/dev/null)

# Sphinx copies book/_static only when some page is rebuilt: when a static file (CSS, fonts) differs from its
# copy in the built book, every page is rebuilt (--all, about 20 s) so that the change reaches the book.
book: $(BOOK_STAMP)
	@echo "The book is at $(CURDIR)/_build/html/index.html"

$(BOOK_STAMP): $(STAMP) $(BOOK_INPUTS)
	@all=""; for f in $$(find book/_static -type f); do \
	  c=_build/html/_static/$${f#book/_static/}; cmp -s "$$f" "$$c" || all="--all"; done; \
	  if [ -n "$$all" ] && [ -d _build/html ]; then echo "book/_static changed: rebuilding every page"; fi; \
	  echo $(VENV)/bin/jupyter-book build . -W --keep-going $$all; \
	  $(VENV)/bin/jupyter-book build . -W --keep-going $$all
	@touch $@

# The browser tests read the built book, so the book is brought up to date first (nothing to do when unchanged).
# pytest's options (nbval, strict, the sanitize file, tests/plugin.py) are in pyproject.toml, so a plain
# `pytest` at the root runs this same suite.
test: book
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -m "not deploy" tests book

# The deployment paths that compile a program each (ONNX exported and run in onnxruntime, AOTInductor packages,
# which need a C++ compiler: apt-get install -y g++): minutes, so not in `make test`; .ci/run runs them.
test-deploy: $(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -q -m deploy tests/deployment/test_deployment.py

# The census of transformers' rotary families (tests/census/): about a minute on 2 cores, so its own target, run by
# .ci/run; it writes nothing (python -m tests.census rewrites benchmarks/results/census-transformers-*.json).
census: $(STAMP)
	POSENC_CENSUS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -p no:xdist -q tests/conventions/test_hf_census.py

# How long `make test` takes here, and where the time goes (a benchmark, not a test: nothing asserts a time).
test-time: $(STAMP)
	$(PY) tools/test_time.py

# The nbval suite as another machine would run it: torch's portable kernels (no vector instructions), then one
# thread. Stored outputs must not depend on either (see the README's edit loop). Here every notebook gets a
# kernel started afresh (`make test` forks them from one that has imported torch: tests/notebooks/kernel_fork.py).
test-portable: $(STAMP)
	POSENC_FRESH_KERNELS=1 ATEN_CPU_CAPABILITY=default $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -q book
	POSENC_FRESH_KERNELS=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -q book

# The package's stated floor: the wheel, installed into a clean venv with the oldest supported torch, passes the
# package tests that need no Jupyter (compile/export tests skip below their own floors). Downloads torch once.
test-floor: $(STAMP)
	$(PY) tools/floor_check.py

test-fast: $(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -x -q tests

# Export first: the notebooks import posenc, which must be what their exported cells say.
notebooks: $(STAMP)
	$(PY) tools/nbexport.py
	$(PY) tools/nbrun.py $(NB)

export: $(STAMP)
	$(PY) tools/nbexport.py

check-export: $(STAMP)
	$(PY) tools/nbexport.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check posenc tests tools benchmarks experiments book
	$(VENV)/bin/ruff format --check posenc tests tools benchmarks experiments book/_ext

# Full sizes on CPU (and CUDA when available), with the torch.compile variants; a few minutes.
bench: $(STAMP)
	$(PY) benchmarks/bench.py --compiled
	$(PY) benchmarks/bench_rotary.py
	$(PY) benchmarks/bench_rotary.py --swap-only
	$(PY) benchmarks/bench_sincos.py
	$(PY) benchmarks/bench_memory.py

# Tiny decoders with each positional scheme on copy, reverse and sort: a learning rate per pair from a grid of
# three, then ten seeds per pair (234 runs), kernels pinned to AVX2. Its wall and processor time are recorded in
# the results file (wall_seconds, cpu_seconds). A stopped sweep resumes from
# experiments/results/position-matters-cpu.json.partial.jsonl when run again at the same commit.
experiment: $(STAMP)
	$(PY) -m experiments.run

# What the rope scalings do past the training length (chapter 09): five byte-level models of mpmath's source trained
# at L = 64, each evaluated under every scaling at 1, 2, 4 and 8 L and fine-tuned under each at 4 L (30 runs, one
# pinned worker, one thread). Refuses uncommitted code; resumes if stopped. Its quick mode is a test.
context-experiment: $(STAMP)
	$(PY) -m experiments.context

# For a machine with CUDA whose own python3 has torch and pytest: no venv, no Jupyter. Under 5 minutes.
gpu-check:
	$(PYTHON) tools/gpu_check.py

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=book $(LAB_ARGS)

clean:
	rm -rf _build .pytest_cache .ruff_cache dist build *.egg-info

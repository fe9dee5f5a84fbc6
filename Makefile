# posenc: the book and the package. `make book` and `make test` are all a fresh clone needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard book/*.ipynb))
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help venv book test test-fast notebooks export check-export lint lab gpu-check bench clean

help:
	@echo "make book       build the HTML book into _build/html (warnings are errors)"
	@echo "make test       run tests/ and every notebook under nbval (stored outputs compared)"
	@echo "make notebooks  re-execute the notebooks in place, storing their outputs"
	@echo "make export     regenerate posenc/ from the notebooks' exported cells"
	@echo "make lab        open JupyterLab on book/ with the project's environment"
	@echo "make lint       ruff on the package, tests, tools and notebooks"
	@echo "make bench      time posenc against the classic recipes and the roofline -> benchmarks/results/"
	@echo "make gpu-check  on a CUDA machine (plain python3 with torch and pytest): GPU tests + benchmark"

venv: $(STAMP)

# Created when missing, refreshed when the pins change.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	@touch $(STAMP)

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(PY) -m pytest $(NBVAL) tests book

test-fast: $(STAMP)
	$(PY) -m pytest -x -q tests

# Export first: the notebooks import posenc, which must be what their exported cells say.
notebooks: $(STAMP)
	$(PY) tools/nbexport.py
	$(PY) tools/nbrun.py $(NB)

export: $(STAMP)
	$(PY) tools/nbexport.py

check-export: $(STAMP)
	$(PY) tools/nbexport.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check posenc tests tools book
	$(VENV)/bin/ruff format --check posenc tests tools

# Full sizes on CPU (and CUDA when available), with the torch.compile variants; a few minutes.
bench: $(STAMP)
	$(PY) benchmarks/bench.py --compiled

# For a machine with CUDA whose own python3 has torch and pytest: no venv, no Jupyter. Under 5 minutes.
gpu-check:
	$(PYTHON) tools/gpu_check.py

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=book

clean:
	rm -rf _build .pytest_cache .ruff_cache dist build *.egg-info

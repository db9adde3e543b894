# Everything sets itself up: each target creates or reuses .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
BUILD  := build

.PHONY: help tutorial test test-all coverage bench lab info clean lock

help:
	@echo "make tutorial  run every notebook at tutorial size into $(BUILD)/"
	@echo "make test      the fast tier: every behaviour once, each notebook once at a tiny size (5-7 min)"
	@echo "make test-all  the full tier CI runs: adds slow and multiprocess tests, hypothesis's ci profile"
	@echo "make coverage  the full tier under coverage of sok_tutorial and data_gen (in-process tests a third slower)"
	@echo "make bench     run benchmarks/*.py, tables on stdout, JSON in $(BUILD)/bench/"
	@echo "make lab       JupyterLab on notebooks/ with the sok-tutorial kernel"
	@echo "make info      versions, devices and which GPU libraries are usable"
	@echo "make clean     remove $(BUILD)/ (keeps .venv)"

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name sok-tutorial --display-name "Python (sok-tutorial)" >/dev/null
	@touch $(STAMP)

tutorial: $(STAMP)
	$(PY) notebooks/run_all.py --build-dir $(BUILD)

# Tiers by marker (pyproject.toml): the fast tier leaves out `slow` and `multiprocess`. Tests run in
# WORKERS processes (pytest-xdist), a file's tests in one of them: a module's fixtures (the worker
# cluster of tests/distribute/test_model_parallel.py) are set up once. Files go out in the order
# tests/conftest.py sorts them (the notebook runs, the longest, first), not by their test counts.
WORKERS ?= 2
PYTEST  := $(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test: $(STAMP)
	$(PYTEST) -m "not slow and not multiprocess"

# The full tier leaves out the smoke runs of notebooks it runs larger (marker `superseded`): a larger
# run asserts the smoke check too. Coverage has a target of its own: its tracer slows in-process tests
# by about a third, and no gate reads its report.
test-all: $(STAMP)
	$(PYTEST) -m "not superseded" --hypothesis-profile=ci

coverage: $(STAMP)
	$(PYTEST) -m "not superseded" --hypothesis-profile=ci --cov=sok_tutorial --cov=data_gen --cov-report=term:skip-covered

bench: $(STAMP)
	@mkdir -p $(BUILD)/bench
	@set -e; for f in benchmarks/[!_]*.py; do echo "== $$f"; $(PY) $$f --out $(BUILD)/bench; done

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

info: $(STAMP)
	$(PY) -m sok_tutorial info

# Re-pin constraints.txt from the current .venv (after changing dependency ranges).
lock: $(STAMP)
	@{ echo "# Exact versions for reproducible installs (pip install -c constraints.txt -e .); regenerate with make lock."; \
	  $(PY) -m pip freeze --exclude-editable --disable-pip-version-check | grep -v '^-e '; } > constraints.txt

clean:
	rm -rf $(BUILD)

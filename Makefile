# Everything sets itself up: each target creates or reuses .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
BUILD  := build

.PHONY: help tutorial test bench lab info clean lock

help:
	@echo "make tutorial  run every notebook at tutorial size into $(BUILD)/"
	@echo "make test      run the test suite (notebooks at smoke size included)"
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

test: $(STAMP)
	$(PY) -m pytest

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

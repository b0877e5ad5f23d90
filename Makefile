# Everything a fresh machine needs: `make test` and `make demo` create .venv and install.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(VENV)/bin/python
PIP_FLAGS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
STAMP := $(VENV)/.icl-ssm-installed

.PHONY: test demo install lint bench clean claims claims-write

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml bench/pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PIP_FLAGS) -e '.[test]' -e bench/
	touch $@

install: $(STAMP)

test: $(STAMP) claims
	$(PY) -m pytest $(PYTEST_ARGS)

# the published tables against the records in docs/results/ (reads JSON, runs no model)
claims: $(STAMP)
	$(PY) tools/claims.py

claims-write: $(STAMP)
	$(PY) tools/claims.py --write

DEMO_OUT ?= demo

# the whole method on the embedded SmolLM2-135M; a second run reuses the finished stages
demo: $(STAMP)
	$(VENV)/bin/icl-ssm run --methods search random bm25 topk --out $(DEMO_OUT)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools research bench

bench: $(STAMP)
	$(VENV)/bin/icl-ssm bench scan

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache

# tvmsched: `make demo` and `make test` work on a fresh machine (they create .venv first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TVMSCHED := $(VENV)/bin/tvmsched
STAMP := $(VENV)/.installed
DEMO_MODEL ?= resnet18
PYTEST_WORKERS ?= 2

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	mkdir -p out
	$(TVMSCHED) models build $(DEMO_MODEL) -o out/$(DEMO_MODEL).onnx
	$(TVMSCHED) compile out/$(DEMO_MODEL).onnx -o out/$(DEMO_MODEL).tvms
	$(TVMSCHED) inspect out/$(DEMO_MODEL).tvms | head -8
	$(TVMSCHED) run out/$(DEMO_MODEL).tvms --check out/$(DEMO_MODEL).onnx --repeat 20

test: setup
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=10

clean:
	rm -rf out .pytest_cache

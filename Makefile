# Two commands for a fresh machine: `make demo` runs the main job, `make test` the test suite.
# Both create .venv on first use (torch pinned first: the unpinned wheel pulls GBs of CUDA packages).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	@# The README's examples use runs/demo; an earlier demo run is kept under its time, never overwritten.
	@if [ -e runs/demo ]; then old=runs/demo-$$(date +%Y%m%d-%H%M%S); mv runs/demo $$old; echo "kept the previous demo run as $$old"; fi
	$(BIN)/vitlab train --set run_name=demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# The unit lane: the tests of one module's behaviour, none that trains, exports, serves or launches a process
# (marked slow or run_level); under 90 s on 2 cores.
test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not slow and not run_level"

# The choices vitlab makes by measuring the machine (calibration, the fp32 kernel), left to it as users get them;
# the rest of the suite pins them (tests/conftest.py). .ci/run runs this after `make test`.
test-automatic: $(BIN)/.installed
	VITLAB_CALIBRATE=1 VITLAB_FP32_KERNEL=auto $(BIN)/python -m pytest -q -m automatic

# Lint and format (ruff) and the seams' types (mypy on tests/protocols.py and the protocols); .ci/run runs it.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: install demo test test-fast test-automatic lint

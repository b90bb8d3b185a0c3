# One entry point for set-up, the demo run and the tests (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := .geopubsub/demo

.PHONY: run test setup lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## make run: generate a demo workload and benchmark the AP-Tree on it, brute force beside it
run: $(STAMP)
	$(BIN)/geopubsub gen --subs 200000 --msgs 10000 --out $(DEMO) --seed 7 --dnf-share 0.1 --circle-share 0.1 --region-msg-share 0.05
	$(BIN)/geopubsub bench match --subs $(DEMO)/subs.jsonl --msgs $(DEMO)/msgs.jsonl --index aptree --baseline-sample 300

## make test: lint and the whole test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .geopubsub

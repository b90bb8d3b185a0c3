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

## make run: generate a demo workload and run the matching benchmark on it (AP-Tree vs brute force)
run: $(STAMP)
	$(BIN)/geopubsub gen --subs 200000 --msgs 5000 --out $(DEMO) --seed 7
	$(BIN)/geopubsub bench match --subs $(DEMO)/subs.jsonl --msgs $(DEMO)/msgs.jsonl --index aptree
	$(BIN)/geopubsub bench match --subs $(DEMO)/subs.jsonl --msgs $(DEMO)/msgs.jsonl --index brute --sample 200

## make test: lint and the whole test suite
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .geopubsub

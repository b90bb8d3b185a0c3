# One entry point for set-up, the demo run and the tests (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := .geopubsub/demo

.PHONY: run test setup lint bench clean redis-server chromium

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# the Debian package; its auto-started system service is not used (the cluster runs its own)
redis-server:
	@command -v redis-server >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server && \
	  { $(SUDO) service redis-server stop || true; }; }

# Debian's headless browser and its driver, for the live map's test (tests/test_livemap.py)
chromium:
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; }

setup: $(STAMP) redis-server

## make run: the demo (geopubsub/tools/demo.py): a local cluster (private redis-server, local Ray, 2 shards),
## 200,000 subscriptions (10 % moving) bulk-loaded with the Spark loader, a publisher and moving subscribers
## as gRPC clients with a live progress line, then throughput, latency, sample deliveries and the
## oracle check of the followed streams; everything started is stopped at the end
run: $(STAMP) redis-server
	$(BIN)/geopubsub demo --work-dir $(DEMO) --subs 200000 --moving-share 0.1 --seed 7 \
	  --dnf-share 0.1 --circle-share 0.1 --region-msg-share 0.05 --shards 2

## make test: lint, the import layers (pyproject.toml [tool.importlinter]) and the whole test suite
test: $(STAMP) redis-server chromium
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	@# the kernels the suite needs later compiled beside its first tests, at the lowest priority
	@# (geopubsub/tools/precompile.py: a head start on a cold numba cache, nothing checked)
	nice -n 19 $(BIN)/python -m geopubsub.tools.precompile > /dev/null 2>&1 & pre=$$!; \
	  $(BIN)/python -m pytest -q; status=$$?; kill $$pre 2>/dev/null; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .geopubsub

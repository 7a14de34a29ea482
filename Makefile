# Two commands a newcomer needs: `make demo` (a local 3-region plane, embedded SQLite, no services
# to install) and `make test` (the whole test suite, starting real PostgreSQL and Kafka itself).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo up test test-fast sim kafka-jars vllm-env lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/convplane demo

up: install
	$(BIN)/convplane up --regions 3

kafka-jars: install
	$(BIN)/python -c "from services.local.kafka import ensure_kafka_jars; print(ensure_kafka_jars())"

# the real-vLLM tier (tests/vllm): vLLM's CPU build in .cache/vllm/venv and a tiny model built
# offline; reused when present (tests.vllm.environment says how and why)
vllm-env: install
	$(BIN)/python -m tests.vllm.environment

test: install
	$(BIN)/pytest -q -p no:cacheprovider tests

test-fast: install
	CONVPLANE_SIM_SEEDS=200 CONVPLANE_PLANE_SEEDS=100 CONVPLANE_NODE_SEEDS=40 $(BIN)/pytest -q -p no:cacheprovider tests/unit tests/sim

sim: install
	$(BIN)/convplane sim --seeds 2000

lint: install
	$(BIN)/ruff check eventlog regions replay services convplane_client tests bench
	$(BIN)/ruff format --check eventlog regions replay services convplane_client tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .cache .state

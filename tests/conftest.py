"""Shared fixtures. Each block belongs to one harness; edit only your own block."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# --- Kafka ---
# One real broker for the whole session, started on first use (see services/localkafka.py for
# how it is chosen: CONVPLANE_TEST_KAFKA, else a local KRaft broker, else testcontainers). A test
# that asks for it fails loudly when no broker can be had; it is never skipped.


@pytest.fixture(scope="session")
def kafka_bootstrap_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from services.localkafka import kafka_for_tests

    with kafka_for_tests(tmp_path_factory.mktemp("kafka")) as bootstrap_servers:
        yield bootstrap_servers


# --- end Kafka ---

"""The Kafka broker a test session uses: ``CONVPLANE_TEST_KAFKA`` (bootstrap servers) when
set; else a local broker (``services.local.kafka``) when Java and Maven are there; else
testcontainers' ``KafkaContainer`` when a Docker daemon exists; else ``KafkaHarnessError``. It
never skips."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from services.local.kafka import KafkaHarnessError, start_broker
from tests.harness.docker import docker_available

TEST_KAFKA_ENV = "CONVPLANE_TEST_KAFKA"


@contextlib.contextmanager
def kafka_for_tests(base_dir: Path) -> Iterator[str]:
    """Yield bootstrap servers of a broker for a test session (see the module docstring)."""
    external = os.environ.get(TEST_KAFKA_ENV, "").strip()
    if external:
        yield external
        return
    if shutil.which("java") and shutil.which("mvn"):
        broker = start_broker(base_dir)
        print(
            f"\nlocal Kafka broker up in {broker.start_duration_s:.1f}s at "
            f"{broker.bootstrap_servers} (pid {broker.pid})",
            file=sys.stderr,
        )
        try:
            yield broker.bootstrap_servers
        finally:
            broker.stop()
        return
    if docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield str(container.get_bootstrap_server())
        return
    raise KafkaHarnessError(
        f"no Kafka for the tests: set {TEST_KAFKA_ENV}=host:port, or install Java 17 and Maven "
        "(the harness downloads the broker), or run a Docker daemon for testcontainers"
    )

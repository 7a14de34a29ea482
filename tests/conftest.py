"""Shared fixtures. Each block belongs to one harness; edit only your own block."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # PostgreSQL block
    from services.localpg import PgInstance

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


# --- PostgreSQL ---
# pg_instances: 3 real PostgreSQL servers for the whole session, chosen by services/localpg.py
# (CONVPLANE_TEST_PG_DSNS, else local binaries, else testcontainers, else a loud error; never a
# skip). pg_databases: a fresh database on each of them per test (dropped after), so tests do not
# see each other's data; yields the SQLAlchemy DSNs.

PG_INSTANCES = 3


@pytest.fixture(scope="session")
def pg_instances() -> Iterator[list[PgInstance]]:
    import contextlib
    import os
    import shutil
    import tempfile

    from services.localpg import pg_instances_for_tests

    # under /tmp, not tmp_path_factory (0700 dirs): the postgres user must reach the data dirs
    base_dir = tempfile.mkdtemp(prefix="convplane-pg-")
    os.chmod(base_dir, 0o711)
    instances: list[PgInstance] = []
    try:
        instances = pg_instances_for_tests(PG_INSTANCES, base_dir)
        yield instances
    finally:
        for instance in instances:
            if instance.external_dsn is None or instance._container is not None:
                with contextlib.suppress(Exception):
                    instance.stop("fast")
        shutil.rmtree(base_dir, ignore_errors=True)


@pytest.fixture
async def pg_databases(pg_instances: list[PgInstance]) -> AsyncIterator[list[str]]:
    import uuid

    name = f"t_{uuid.uuid4().hex[:16]}"
    for instance in pg_instances:
        _ensure_pg_running(instance)  # a previous test may have killed or stopped it
        await _pg_admin(instance, f"CREATE DATABASE {name}")
    yield [instance.dsn_for(name) for instance in pg_instances]
    for instance in pg_instances:
        _ensure_pg_running(instance)
        await _pg_admin(instance, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _ensure_pg_running(instance: PgInstance) -> None:
    if instance.external_dsn is None and not instance.running:
        instance.start()


async def _pg_admin(instance: PgInstance, sql: str) -> None:
    import asyncpg

    dsn = instance.dsn.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        await conn.execute(sql, timeout=60)
    finally:
        await conn.close(timeout=30)


# --- end PostgreSQL ---

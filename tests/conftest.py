"""Shared fixtures. Each block belongs to one harness; edit only your own block."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # PostgreSQL block
    from services.local.postgres import PgInstance

# --- Kafka ---
# One real broker for the whole session, started on first use (see services/local/kafka.py for
# how it is chosen: CONVPLANE_TEST_KAFKA, else a local KRaft broker, else testcontainers). A test
# that asks for it fails loudly when no broker can be had; it is never skipped.


@pytest.fixture(scope="session")
def kafka_bootstrap_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.harness.kafka import kafka_for_tests

    with kafka_for_tests(tmp_path_factory.mktemp("kafka")) as bootstrap_servers:
        yield bootstrap_servers


# --- end Kafka ---


# --- PostgreSQL ---
# pg_instances: 3 real PostgreSQL servers for the whole session, chosen by services/local/postgres.py
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
    from pathlib import Path

    from tests.harness.postgres import pg_instances_for_tests

    # under /tmp, not tmp_path_factory (0700 dirs): the postgres user must reach the data dirs
    base_dir = tempfile.mkdtemp(prefix="convplane-pg-")
    os.chmod(base_dir, 0o711)
    instances: list[PgInstance] = []
    # TCP to the servers the harness starts is TLS only, verify-full, as in convplane up; the
    # CA reaches asyncpg (directly and under SQLAlchemy) through PGSSLROOTCERT
    tls_dir = Path(base_dir) / "tls"
    previous_root = os.environ.get("PGSSLROOTCERT")
    os.environ["PGSSLROOTCERT"] = str(tls_dir / "ca.pem")
    try:
        instances = pg_instances_for_tests(PG_INSTANCES, base_dir, tls_dir=tls_dir)
        yield instances
    finally:
        if previous_root is None:
            os.environ.pop("PGSSLROOTCERT", None)
        else:
            os.environ["PGSSLROOTCERT"] = previous_root
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

    from services.deploy.db_roles import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(instance.dsn), timeout=30)
    try:
        await conn.execute(sql, timeout=60)
    finally:
        await conn.close(timeout=30)


# --- end PostgreSQL ---


# --- log on PostgreSQL ---
# log_cluster: the event log on this test's three databases (pg_databases), one region each
# ("a", "b", "c" on pg_instances[0..2]). It opens replica stores (directly, or through a fault
# proxy it starts) and LogNodes, and closes all of them after the test, nodes first. audit_log
# reads every replica's log directly and checks the log's promises (see its docstring).

if TYPE_CHECKING:  # log on PostgreSQL block
    from typing import Any

LOG_REGIONS = ("a", "b", "c")


class LogCluster:
    """Stores, proxies and nodes of one test; ``close`` releases them in reverse order."""

    def __init__(self, instances: list[PgInstance], dsns: list[str]) -> None:
        self.instances = dict(zip(LOG_REGIONS, instances, strict=False))
        self.dsns = dict(zip(LOG_REGIONS, dsns, strict=False))
        self.proxies: dict[str, Any] = {}  # "<node>-><region>" -> FaultProxy
        self._stores: list[Any] = []
        self._nodes: list[Any] = []

    async def store(self, region: str, *, via_proxy: str | None = None, **limits: Any) -> Any:
        """A replica store of ``region``; ``via_proxy`` names a proxy that relays to it."""
        from urllib.parse import urlsplit

        from eventlog.stores import open_replica_store
        from services.local.faultproxy import FaultProxy, ProxySpec
        from tests.harness.postgres import dsn_via

        dsn = self.dsns[region]
        if via_proxy is not None:
            target = urlsplit(dsn)
            proxy = FaultProxy(
                ProxySpec(via_proxy, 0, target.hostname or "127.0.0.1", target.port or 5432),
                connect_timeout_s=2.0,
            )
            await proxy.start()
            self.proxies[via_proxy] = proxy
            dsn = dsn_via(dsn, "127.0.0.1", proxy.port)
        limits = {"statement_timeout_s": 2.0, "connect_timeout_s": 2.0, **limits}
        store = await open_replica_store(dsn, region, **limits)
        self._stores.append(store)
        return store

    async def node(
        self,
        region: str,
        *,
        proxied: tuple[str, ...] = (),
        seed: int = 1,
        store_limits: dict[str, Any] | None = None,
        **config: Any,
    ) -> Any:
        """A LogNode of ``region`` writing to all three databases; its links to the regions in
        ``proxied`` go through proxies named ``"<region>-><target>"``; ``store_limits`` go to
        every store it opens, ``config`` to its LogConfig."""
        import random

        from eventlog.clock import SystemClock
        from eventlog.config import LogConfig
        from eventlog.node import LogNode

        replicas = {
            target: await self.store(
                target,
                via_proxy=f"{region}->{target}" if target in proxied else None,
                **(store_limits or {}),
            )
            for target in LOG_REGIONS
        }
        settings: dict[str, Any] = {
            "shard_count": 4,
            "replica_call_timeout_s": 1.0,
            "append_timeout_s": 3.0,
            "lead_timeout_s": 15.0,
            "replica_suspect_after_s": 1.5,
            **config,
        }
        node = LogNode(
            region=region,
            replicas=replicas,
            config=LogConfig(**settings),
            clock=SystemClock(),
            rng=random.Random(seed),
        )
        self._nodes.append(node)
        return node

    async def close(self) -> None:
        for node in reversed(self._nodes):
            await node.close()
        for proxy in self.proxies.values():
            await proxy.close()
        for store in reversed(self._stores):
            await store.close()


@pytest.fixture
async def log_cluster(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> AsyncIterator[LogCluster]:
    cluster = LogCluster(pg_instances, pg_databases)
    try:
        yield cluster
    finally:
        await cluster.close()


async def audit_log(
    stores: dict[str, Any],
    shard: int,
    commit_lsn: int,
    acked: list[Any],
    *,
    holders_min: int,
    page_events: int = 1000,
) -> list[Any]:
    """Read every replica's log of ``shard`` (``stores``: region -> ReplicaStore, read directly)
    and check: (1) the replicas' logs through ``commit_lsn`` are identical on every replica that
    holds that far, and at least ``holders_min`` do (shorter ones are prefixes of it); (2) every
    acknowledged event (an ``AppendedEvent`` of this shard) is in that committed prefix at its
    lsn, with its event id; (3) each conversation's seq in the prefix is 0, 1, 2, ... gapless.
    Returns the committed prefix."""
    import json

    logs: dict[str, list[Any]] = {}
    for region, store in stores.items():
        entries: list[Any] = []
        while True:
            page = await store.read_log(shard, entries[-1].lsn if entries else 0, page_events)
            entries.extend(page)
            if len(page) < page_events:
                break
        assert [e.lsn for e in entries] == list(range(1, len(entries) + 1)), region
        logs[region] = [e for e in entries if e.lsn <= commit_lsn]
    full = {r: log for r, log in logs.items() if len(log) == commit_lsn}
    assert len(full) >= holders_min, f"only {sorted(full)} hold the commit point {commit_lsn}"
    prefix = next(iter(full.values()))
    for region, log in logs.items():
        assert log == prefix[: len(log)], f"{region}'s committed log differs"
    for event in acked:
        if event.shard != shard:
            continue
        assert event.lsn <= commit_lsn, f"acked lsn {event.lsn} above commit {commit_lsn}"
        entry = prefix[event.lsn - 1]
        assert (entry.conversation_id, entry.seq) == (event.conversation_id, event.seq)
        assert json.loads(entry.body)["event_id"] == event.event_id
    last_seq: dict[str, int] = {}
    for entry in prefix:
        if entry.conversation_id:
            expected = last_seq.get(entry.conversation_id, -1) + 1
            assert entry.seq == expected, f"{entry.conversation_id}: seq {entry.seq}"
            last_seq[entry.conversation_id] = entry.seq
    return prefix


@pytest.fixture
def log_audit() -> Any:
    """``audit_log`` for tests (conftest functions are not imported by test modules)."""
    return audit_log


# --- end log on PostgreSQL ---


# --- linearizability checker ---
# lincheck_binary: the Porcupine checker of tests/lincheck (Go), built once per session. No Go
# toolchain, or no way to fetch its one module, fails the test loudly; it is never skipped.


@pytest.fixture(scope="session")
def lincheck_binary() -> Any:
    from tests.lincheck.checker import build_checker

    return build_checker()


# --- end linearizability checker ---

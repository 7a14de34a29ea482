"""The replica store on real PostgreSQL: the conformance suite, fencing between concurrent
leader processes, and a server killed with SIGKILL in the middle of appends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from eventlog.errors import InvariantViolation, ReplicaUnavailable
from eventlog.model import Accepted, AppendReply, LogEntry, Promised, Rejected
from eventlog.stores import SqlReplicaStore, open_replica_store
from services.deploy.db_roles import asyncpg_dsn
from services.local.postgres import PgInstance
from tests.replica_conformance import ReplicaConformance, ReplicaOpener, entry, run

pytestmark = pytest.mark.postgres


@pytest.fixture
async def replica_opener(pg_databases: list[str]) -> AsyncIterator[ReplicaOpener]:
    async def make() -> SqlReplicaStore:
        return await open_replica_store(pg_databases[0], "r1")

    opener = ReplicaOpener(make)
    yield opener
    await opener.close_all()


class TestPostgresConformance(ReplicaConformance):
    """The whole suite of tests/replica_conformance.py, on PostgreSQL."""


async def test_lower_epoch_never_accepted_after_higher_prepare(pg_databases: list[str]) -> None:
    """Two leader processes (two engines, two pools) share one database; the old one keeps
    appending while the new one prepares. No append the old leader sends after the new prepare
    returned may be accepted, on any shard."""
    shards, rounds_max = 8, 400
    old = await open_replica_store(pg_databases[0], "old-leader", batch_linger_ms=0)
    new = await open_replica_store(pg_databases[0], "new-leader")
    promised = {shard: asyncio.Event() for shard in range(shards)}
    going = {shard: asyncio.Event() for shard in range(shards)}  # the old leader was acked once
    late_accepts: list[tuple[int, int]] = []
    try:
        for shard in range(shards):
            assert isinstance(await old.prepare(shard, 1, 0), Promised)

        async def old_leader(shard: int) -> None:
            for r in range(rounds_max):
                sent_after_promise = promised[shard].is_set()
                reply = await old.append(shard, 1, r, 1 if r else 0, run(r + 1, r + 1, 1), r)
                if isinstance(reply, Accepted):
                    going[shard].set()
                    if sent_after_promise:
                        late_accepts.append((shard, r))
                if isinstance(reply, Rejected):
                    assert reply.promised_epoch == 2
                    return
            raise AssertionError(f"shard {shard}: the old leader was never fenced")

        async def new_leader(shard: int) -> None:
            await going[shard].wait()  # the new leader takes over mid-stream
            assert isinstance(await new.prepare(shard, 2, 1000), Promised)
            promised[shard].set()

        await asyncio.gather(
            *(old_leader(s) for s in range(shards)), *(new_leader(s) for s in range(shards))
        )
        assert late_accepts == []
        for shard in range(shards):
            status = await new.status(shard)
            assert status.promised_epoch == 2 and status.last_lsn > 0
    finally:
        await old.close()
        await new.close()


async def test_killed_server_is_unavailable_then_recovers(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> None:
    server, dsn = pg_instances[-1], pg_databases[-1]
    store = await open_replica_store(dsn, "r1", statement_timeout_s=3.0, connect_timeout_s=2.0)
    accepted: dict[int, list[LogEntry]] = {}
    errors: list[BaseException] = []
    enough = asyncio.Event()
    shards = 16
    try:

        async def writer(shard: int) -> None:
            assert isinstance(await store.prepare(shard, 1, 0), Promised)
            lsn = 0
            while True:
                batch = run(lsn + 1, lsn + 2, 1, conversation=f"s{shard}")
                try:
                    reply = await store.append(shard, 1, lsn, 1 if lsn else 0, batch, lsn)
                except ReplicaUnavailable as error:
                    errors.append(error)
                    return
                assert reply == Accepted(lsn + 2)
                accepted.setdefault(shard, []).extend(batch)
                lsn += 2
                if sum(len(v) for v in accepted.values()) >= 400:
                    enough.set()

        async def killer() -> None:
            await enough.wait()
            server.kill()

        await asyncio.wait_for(asyncio.gather(*(writer(s) for s in range(shards)), killer()), 60)
        assert len(errors) == shards  # every writer saw the crash as ReplicaUnavailable
        assert all(isinstance(e.__cause__, BaseException) for e in errors)
        with pytest.raises(ReplicaUnavailable):
            await store.status(0)

        await asyncio.to_thread(server.start)
        reply = await _append_with_retries(store, accepted)
        assert reply == Accepted(len(accepted[0]) + 1)
        for shard, entries in accepted.items():
            assert (await store.read_log(shard, 0, 10_000))[: len(entries)] == entries
    finally:
        await store.close()
        if not server.running:
            server.start()


async def _append_with_retries(
    store: SqlReplicaStore, accepted: dict[int, list[LogEntry]]
) -> AppendReply:
    last_lsn = len(accepted[0])
    for _ in range(20):
        try:
            return await store.append(0, 1, last_lsn, 1, run(last_lsn + 1, last_lsn + 1, 1), 0)
        except ReplicaUnavailable:
            await asyncio.sleep(0.25)
    raise AssertionError("the store did not recover after the server came back")


async def test_connections_the_server_closed_are_replaced_without_a_failed_call(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> None:
    """The store does not ping a pooled connection before each use (three round trips each);
    a connection the server closed (a restart, an administrator, an idle timeout) is noticed
    locally and replaced. So after every connection of the store was terminated server-side,
    the very next reads and appends succeed: none is spent discovering the dead connection."""
    store = await open_replica_store(pg_databases[0], "r1", pool_size=4, pool_max_overflow=0)
    try:
        assert isinstance(await store.prepare(0, 1, 0), Promised)
        assert await store.append(0, 1, 0, 0, run(1, 1, 1), 0) == Accepted(1)
        await asyncio.gather(*(store.read_log(0, 0, 10) for _ in range(4)))  # the whole pool
        assert (await store.status(0)).last_lsn == 1  # and the status reads' kept connection
        database = urlsplit(pg_databases[0]).path.lstrip("/")
        await _terminate_backends(pg_instances[0], database)
        await asyncio.sleep(0.2)  # let the event loop read the closed sockets

        statuses = await asyncio.gather(*(store.status(0) for _ in range(4)))
        assert {s.last_lsn for s in statuses} == {1}
        logs = await asyncio.gather(*(store.read_log(0, 0, 10) for _ in range(4)))
        assert {len(entries) for entries in logs} == {1}
        assert await store.append(0, 1, 1, 1, run(2, 2, 1), 1) == Accepted(2)
    finally:
        await store.close()


async def _terminate_backends(instance: PgInstance, database: str) -> None:
    """Terminate every session on ``database`` and wait until the server shows none."""
    import asyncpg

    admin = await asyncpg.connect(asyncpg_dsn(instance.dsn))
    try:
        sessions = "FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
        terminated = await admin.fetchval(
            f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) {sessions}", database
        )
        assert terminated >= 4, f"expected the store's sessions, terminated {terminated}"
        for _ in range(100):
            if not await admin.fetchval(f"SELECT count(*) {sessions}", database):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"sessions on {database} outlived pg_terminate_backend")
    finally:
        await admin.close()


async def _sessions_started(admin: Any, database: str) -> int:
    """Sessions the server has started on ``database`` so far."""
    started: int = await admin.fetchval(
        "SELECT sessions FROM pg_stat_database WHERE datname = $1", database
    )
    return started


async def test_status_reads_their_callers_abandon_keep_their_connection(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> None:
    """A read-index round abandons the slower replicas' status reads once it has its quorum
    (the controller runs one ten times a second). The query runs to its end instead of being
    cancelled midway, so its connection is kept: reads abandoned while their query waits at the
    server start no new server session (each one dropped and reopened its connection before: a
    new backend, TLS and SCRAM per round)."""
    import asyncpg

    store = await open_replica_store(pg_databases[0], "r1", pool_size=2, pool_max_overflow=0)
    database = urlsplit(pg_databases[0]).path.lstrip("/")
    admin = await asyncpg.connect(asyncpg_dsn(pg_databases[0]))  # holds the table's lock
    watcher = await asyncpg.connect(asyncpg_dsn(pg_instances[0].dsn))
    try:
        assert isinstance(await store.prepare(0, 1, 0), Promised)
        assert (await store.status(0)).promised_epoch == 1  # the kept connection is open
        before = await _sessions_started(watcher, database)
        for _ in range(5):
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE shards IN ACCESS EXCLUSIVE MODE")
            abandoned = [asyncio.ensure_future(store.status(shard)) for shard in (0, 1, 0)]
            await _until_queries_wait(watcher, database, 1)
            for read in abandoned:
                read.cancel()
            await lock.rollback()
            assert (await store.status(0)).promised_epoch == 1  # and the store still answers
        assert await _sessions_started(watcher, database) == before
    finally:
        await admin.close()
        await watcher.close()
        await store.close()


async def test_status_reads_of_many_shards_are_one_query_at_a_time(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> None:
    """Twenty reads of twenty shards while the table is locked: one query waits at the server
    (the first read's), the other nineteen wait for the next query, which reads them all."""
    import asyncpg

    store = await open_replica_store(pg_databases[0], "r1", pool_size=4, pool_max_overflow=0)
    database = urlsplit(pg_databases[0]).path.lstrip("/")
    admin = await asyncpg.connect(asyncpg_dsn(pg_databases[0]))
    watcher = await asyncpg.connect(asyncpg_dsn(pg_instances[0].dsn))
    try:
        for shard in range(20):
            assert isinstance(await store.prepare(shard, 1 + shard, 0), Promised)
        lock = admin.transaction()
        await lock.start()
        await admin.execute("LOCK TABLE shards IN ACCESS EXCLUSIVE MODE")
        reads = [asyncio.ensure_future(store.status(shard)) for shard in range(20)]
        await _until_queries_wait(watcher, database, 1)
        await asyncio.sleep(0.2)  # time for any other query to reach the server
        assert await watcher.fetchval(_WAITING, database) == 1
        await lock.rollback()
        statuses = await asyncio.gather(*reads)
        assert [s.promised_epoch for s in statuses] == [1 + shard for shard in range(20)]
    finally:
        await admin.close()
        await watcher.close()
        await store.close()


_WAITING = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'"


async def _until_queries_wait(watcher: Any, database: str, queries: int) -> None:
    """Until ``queries`` statements on ``database`` wait for a lock."""
    for _ in range(500):
        if await watcher.fetchval(_WAITING, database) == queries:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{queries} statements never waited at the locked table")


async def test_a_transcript_read_that_timed_out_leaves_no_broken_connection(
    pg_instances: list[PgInstance], pg_databases: list[str]
) -> None:
    """Reads of a conversation and of the identity go to asyncpg directly on a pooled
    connection. One that times out at the server (a locked table) is ReplicaUnavailable, and
    its connection, the only one the pool has for reads, cancelled midway, is invalidated, as
    SQLAlchemy does with a statement of its own: the next read opens a new session, and the
    next reads succeed."""
    import asyncpg

    # two connections: the group committer keeps one, the reads share the other
    store = await open_replica_store(
        pg_databases[0], "r1", pool_size=2, pool_max_overflow=0, statement_timeout_s=1.0
    )
    admin = await asyncpg.connect(asyncpg_dsn(pg_databases[0]))
    watcher = await asyncpg.connect(asyncpg_dsn(pg_instances[0].dsn))
    database = urlsplit(pg_databases[0]).path.lstrip("/")
    try:
        assert isinstance(await store.prepare(0, 1, 0), Promised)
        entries = run(1, 2, 1, conversation="c", tenant_id="t")
        assert isinstance(await store.append(0, 1, 0, 0, entries, 0), Accepted)
        identity = await store.identity()
        for table, read in (
            ("entries", lambda: store.read_conversation(0, "t", "c", 0, 10, 2)),
            ("replica_identity", store.identity),
            ("shards", lambda: store.read_page_snapshot(0, "t", "c", 0, 10, 2)),
        ):
            lock = admin.transaction()
            await lock.start()
            await admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            sessions = await _sessions_started(watcher, database)
            with pytest.raises(ReplicaUnavailable):
                await read()
            await lock.rollback()
            assert [e.seq for e in await store.read_conversation(0, "t", "c", 0, 10, 2)] == [1, 2]
            assert await store.identity() == identity
            assert await _sessions_started(watcher, database) == sessions + 1, table
    finally:
        await admin.close()
        await watcher.close()
        await store.close()


async def test_a_store_without_its_identity_row_is_unavailable(pg_databases: list[str]) -> None:
    import asyncpg

    store = await open_replica_store(pg_databases[0], "r1")
    admin = await asyncpg.connect(asyncpg_dsn(pg_databases[0]))
    try:
        assert "/db" in await store.identity()
        await admin.execute("DELETE FROM replica_identity")
        with pytest.raises(ReplicaUnavailable, match="0 identity rows"):
            await store.identity()
        with pytest.raises(ReplicaUnavailable, match="0 identity rows"):
            await store.read_page_snapshot(0, "t", "c", -1, 10, 0)
    finally:
        await admin.close()
        await store.close()


async def test_a_transcript_page_reads_its_own_rows_not_the_conversations(
    pg_databases: list[str],
) -> None:
    """A page of 20 from a 400-entry conversation: PostgreSQL walks the conversation's index in
    seq order and stops after the page, with no sort. Ordered by seq and lsn, the plan hung on
    the planner's row estimate: here an incremental sort, on ``bench/rest.py``'s data (the
    shard, tenant and conversation estimated independently: 6 rows for 400) a bitmap scan of
    the whole conversation and a top-N sort, 1.6 ms per page against 0.13."""
    import asyncpg

    from eventlog.stores._pg_writes import _CONVERSATION_PAGE

    store = await open_replica_store(pg_databases[0], "r1")
    admin = await asyncpg.connect(asyncpg_dsn(pg_databases[0]))
    try:
        for shard in range(2):
            assert isinstance(await store.prepare(shard, 1, 0), Promised)
            for first in range(1, 1201, 200):  # three conversations interleaved
                page = [
                    entry(lsn, 1, conversation=f"c{lsn % 3}", seq=(lsn + 2) // 3, body="x" * 1000)
                    for lsn in range(first, first + 200)
                ]
                reply = await store.append(shard, 1, first - 1, 1 if first > 1 else 0, page, 0)
                assert isinstance(reply, Accepted)
        await admin.execute("ANALYZE entries")
        # the plan asyncpg's prepared statement ends up with: a generic one, for any values
        await admin.execute("SET plan_cache_mode = force_generic_plan")
        await admin.execute(f"PREPARE page AS {_CONVERSATION_PAGE}")
        explained = await admin.fetch(
            "EXPLAIN (ANALYZE) EXECUTE page (1, 'tenant-of-c1', 'c1', 0, 1200, 20)"
        )
        plan = "\n".join(row[0] for row in explained)
        assert "Bitmap" not in plan, plan
        scan = next(
            line for line in plan.splitlines() if "Index Scan using ix_entries_conv" in line
        )
        assert re.search(r"actual time=\S+ rows=20(\.0+)? loops=1", scan), plan  # stopped
        for line in plan.splitlines():  # the statement's own sort (the outer one) sorts the page
            if "Sort" in line and "actual time" in line:
                assert re.search(r"actual time=\S+ rows=20(\.0+)? loops=1", line), plan
        page = await store.read_conversation(1, "tenant-of-c1", "c1", 0, 20, 1200)
        assert [e.seq for e in page] == list(range(1, 21))
    finally:
        await admin.close()
        await store.close()


async def test_two_entries_with_one_seq_below_the_commit_point_are_a_bug(
    pg_databases: list[str],
) -> None:
    store = await open_replica_store(pg_databases[0], "r1")
    try:
        assert isinstance(await store.prepare(0, 1, 0), Promised)
        twice = [entry(1, 1, conversation="c", seq=1), entry(2, 1, conversation="c", seq=1)]
        assert isinstance(await store.append(0, 1, 0, 0, twice, 0), Accepted)
        with pytest.raises(InvariantViolation, match="seq 1 at lsn 1, then seq 1 at lsn 2"):
            await store.read_conversation(0, "tenant-of-c", "c", 0, 10, 2)
    finally:
        await store.close()

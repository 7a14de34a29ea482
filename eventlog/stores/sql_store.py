"""``SqlReplicaStore``: the replica port on SQLAlchemy's async engine (PostgreSQL or SQLite).

Writes go through the group committer (appends) or straight to a pooled connection (prepare);
the dialect-specific write paths are ``_pg_writes`` (one PL/pgSQL call) and ``_sqlite_writes``
(the pure plan inside BEGIN IMMEDIATE). Reads are plain portable SQL. Every database call runs
under ``statement_timeout_s`` and driver errors leave this module as ``ReplicaUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import BigInteger, ColumnElement, cast, collate, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventlog.clock import Clock, SystemClock
from eventlog.errors import InvariantViolation
from eventlog.identity import IdentityRecord
from eventlog.model import (
    AppendReply,
    ConversationSummary,
    HeldPosition,
    LogEntry,
    PageSnapshot,
    PrepareReply,
    ShardStatus,
)
from eventlog.replica import ReplicaStore
from eventlog.stores import _pg_writes, _sqlite_writes
from eventlog.stores._engine import (
    AUTOCOMMIT_OPTION,
    SQLITE_WRITE_OPTION,
    StoreConfig,
    checked_out,
    sqlite_file,
    translated,
)
from eventlog.stores._plan import AppendRequest, check_append_request, check_storable
from eventlog.stores._schema import (
    entries,
    entry_from_row,
    replica_identity,
    replica_positions,
    replica_registry,
    shards,
    status_from_row,
)
from eventlog.stores.group_commit import AppendOutcome, GroupCommitter
from eventlog.stores.status_reads import StatusReads

#: how long closing a store waits for its status query under way
_CLOSE_WAIT_S = 1.0


class _WritePath(Protocol):
    """What ``_pg_writes`` and ``_sqlite_writes`` provide (each module is one)."""

    async def prepare(
        self, conn: AsyncConnection, shard: int, epoch: int, tail_max: int
    ) -> PrepareReply: ...


class SqlReplicaStore(ReplicaStore):
    """One region's replica in a SQL database. Build it with ``open_replica_store``."""

    def __init__(
        self, engine: AsyncEngine, region: str, limits: StoreConfig, clock: Clock | None = None
    ) -> None:
        self.region = region
        self.limits = limits
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        self._sqlite_file = sqlite_file(engine)  # what a group's lock timeout names the holder of
        self._writes: _WritePath = _pg_writes if self._postgres else _sqlite_writes
        self._writer = _KeptConnection(engine, sqlite_write=True)  # the group committer's only
        #: kept for the status reads (PostgreSQL), which go many shards to a query
        self._status_conn = _KeptConnection(engine, sqlite_write=False)
        self._status_reads = StatusReads(region, self._read_statuses) if self._postgres else None
        self._closed = False
        self._committer = GroupCommitter(
            self._execute_group,
            region=region,
            clock=clock or SystemClock(),
            linger_s=limits.batch_linger_ms / 1000,
            events_max=limits.batch_events_max,
            queue_max=limits.queue_max,
        )

    @property
    def groups_committed(self) -> int:
        return self._committer.groups_committed

    # --- writes --------------------------------------------------------------------------

    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply:
        async with self._connection("prepare", write=True) as conn:
            return await self._writes.prepare(conn, shard, epoch, tail_max)

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply:
        request = AppendRequest(
            shard,
            epoch,
            prev_lsn,
            prev_epoch,
            tuple(entries),
            leader_commit_lsn,
            expected_store_id,
            tuple(sorted((positions or {}).items())),
        )
        check_append_request(request)
        check_storable(request, nul_in_columns=not self._postgres)
        return await self._committer.submit(request)

    async def _execute_group(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """One group, one transaction, on the committer's own connection.

        The committer keeps one connection checked out instead of taking one from the pool per
        group. Any failure throws the connection away; the next group checks out a new one
        (a closed one is discarded at checkout, ``_engine``), which is how the store reconnects
        after the database comes back.
        """
        async with translated(self.region, "append", sqlite_write_to=self._sqlite_file):
            async with asyncio.timeout(self.limits.statement_timeout_s):
                conn = await self._writer.get()
                try:
                    if self._postgres:  # the identity check is in the statement
                        return await _pg_writes.append_group(conn, self.region, requests)
                    return await _sqlite_writes.append_group(
                        conn, self.region, requests, self._sqlite_identity
                    )
                except BaseException:
                    await self._writer.drop(invalidate=True)
                    raise

    # --- reads ---------------------------------------------------------------------------

    async def status(self, shard: int) -> ShardStatus:
        """PostgreSQL: many shards to a query, one query at a time, on a connection kept for
        these reads (``eventlog.stores.status_reads``); SQLite: on a pooled connection."""
        if self._status_reads is not None:
            return await self._status_reads.status(shard)
        async with self._connection("status") as conn:
            result = await conn.execute(select(shards).where(shards.c.shard == shard))
            return status_from_row(result.mappings().first())

    async def _read_statuses(self, shard_ids: list[int]) -> dict[int, ShardStatus]:
        async with translated(self.region, "status"):
            async with asyncio.timeout(self.limits.statement_timeout_s):
                conn = await self._status_conn.get()
                try:
                    return await _pg_writes.statuses(conn, self.region, shard_ids)
                except BaseException:  # its state unknown (a timeout mid-statement)
                    await self._status_conn.drop(invalidate=True)
                    raise

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        if limit <= 0:
            return []
        query = (
            select(entries)
            .where(entries.c.shard == shard, entries.c.lsn > after_lsn)
            .order_by(entries.c.lsn)
            .limit(limit)
        )
        return await self._entries("read_log", query)

    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        if limit <= 0:
            return []
        page = await self.read_page_snapshot(
            shard, tenant_id, conversation_id, after_seq, limit, max_lsn
        )
        return page.entries

    async def read_page_snapshot(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> PageSnapshot:
        """One snapshot: on PostgreSQL one statement (``_pg_writes.conversation_page``), on
        SQLite one read transaction (WAL: its snapshot is taken at its first read).

        The page is in seq order alone, the order of ``ix_entries_conversation`` (shard,
        tenant, conversation, seq): a page reads its own rows. Ordered by (seq, lsn) it read
        and sorted every entry of the conversation for each page (PostgreSQL: a bitmap scan
        and a top-N sort). Below the commit point, the one callers read up to, a conversation
        holds each seq once (its order is gapless and the source's log matches the leader's
        there), so seq alone orders a page; two entries with one seq would mean it does not."""
        if self._postgres:
            async with self._direct("read_conversation") as conn:
                page = await _pg_writes.conversation_page(
                    conn,
                    self.region,
                    (shard, tenant_id, conversation_id),
                    after_seq,
                    limit,
                    max_lsn,
                )
        else:
            query = (
                select(entries)
                .where(
                    entries.c.shard == shard,
                    entries.c.tenant_id == tenant_id,
                    entries.c.conversation_id == conversation_id,
                    entries.c.seq > after_seq,
                    entries.c.lsn <= max_lsn,
                )
                .order_by(entries.c.seq)
                .limit(max(limit, 0))
            )
            async with self._connection("read_conversation") as conn:
                rows = (await conn.execute(query)).mappings().all()
                store_id = await self._sqlite_identity(conn)
                status = await conn.execute(select(shards).where(shards.c.shard == shard))
                page = PageSnapshot(
                    [entry_from_row(r) for r in rows],
                    store_id,
                    status_from_row(status.mappings().first()),
                )
        _one_entry_per_seq(page.entries, self.region, conversation_id)
        return page

    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        if limit <= 0:
            return []
        # the conversations with an entry at or after the cutoff (those whose latest activity
        # is at or after it): on PostgreSQL from the pages written since, by the BRIN index of
        # migration 0006, not from the whole shard; then their totals, by ix_entries_conversation
        active = (
            select(entries.c.tenant_id, entries.c.conversation_id)
            .where(
                entries.c.shard == shard,
                entries.c.created_at_ms >= active_since_ms,
                entries.c.lsn <= max_lsn,
                entries.c.conversation_id != "",  # leader barriers belong to no conversation
            )
            .distinct()
            .cte("active")
        )
        last_activity = func.max(entries.c.created_at_ms)
        query = (
            select(
                entries.c.tenant_id,
                entries.c.conversation_id,
                last_activity.label("last_activity_ms"),
                cast(func.sum(entries.c.token_count), BigInteger).label("token_count"),
                func.max(entries.c.seq).label("last_seq"),
            )
            .join_from(
                entries,
                active,
                (entries.c.tenant_id == active.c.tenant_id)
                & (entries.c.conversation_id == active.c.conversation_id),
            )
            .where(entries.c.shard == shard, entries.c.lsn <= max_lsn)
            .group_by(entries.c.tenant_id, entries.c.conversation_id)
            .order_by(
                last_activity.desc(),
                self._codepoint_order(entries.c.conversation_id),
                self._codepoint_order(entries.c.tenant_id),
            )
            .limit(limit)
        )
        async with self._connection("list_conversations") as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            ConversationSummary(
                tenant_id=r["tenant_id"],
                conversation_id=r["conversation_id"],
                last_activity_ms=int(r["last_activity_ms"]),
                token_count=int(r["token_count"]),
                last_seq=int(r["last_seq"]),
            )
            for r in rows
        ]

    def _codepoint_order(self, column: ColumnElement[str]) -> ColumnElement[str]:
        # Python's string order (the reference's) is code point order: SQLite's BINARY collation,
        # PostgreSQL's "C" collation (the database default may be a locale's).
        return collate(column, "C") if self._postgres else column

    async def _entries(self, what: str, query: Any) -> list[LogEntry]:
        async with self._connection(what) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [entry_from_row(r) for r in rows]

    def _connection(
        self, what: str, *, write: bool = False
    ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return checked_out(
            self._engine, self.region, what, self.limits.statement_timeout_s, write=write
        )

    @contextlib.asynccontextmanager
    async def _direct(self, what: str) -> AsyncIterator[AsyncConnection]:
        """A pooled connection for a statement sent through asyncpg directly
        (``_pg_writes``): one that failed or timed out midway is invalidated, as SQLAlchemy
        does with the statements it runs, so the pool never hands out a connection in an
        unknown state."""
        async with self._connection(what) as conn:
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(Exception):  # the statement's error is the one to see
                    await conn.invalidate()
                raise

    # --- identity (eventlog.identity) ----------------------------------------------------

    async def identity(self) -> str:
        """The ``store_id`` made by the migration, qualified by where the data lives now: the
        database's oid (PostgreSQL: a dump restored into a new database is a new database) or
        the file's inode (SQLite: a copied-back backup file is a new file)."""
        if self._postgres:
            async with self._direct("identity") as conn:
                return await _pg_writes.identity(conn, self.region)
        async with self._connection("identity") as conn:
            return await self._sqlite_identity(conn)

    async def _sqlite_identity(self, conn: AsyncConnection) -> str:
        store_id = (await conn.execute(select(replica_identity.c.store_id))).scalar_one()
        path = self._engine.url.database or ""
        return f"{store_id}/ino{os.stat(path).st_ino}"

    async def positions(self, shard: int) -> dict[str, HeldPosition]:
        query = select(replica_positions).where(replica_positions.c.shard == shard)
        async with self._connection("positions") as conn:
            rows = (await conn.execute(query)).mappings().all()
        return {r["region"]: HeldPosition(int(r["epoch"]), int(r["lsn"])) for r in rows}

    async def registry(self) -> dict[str, IdentityRecord]:
        async with self._connection("registry") as conn:
            rows = (await conn.execute(select(replica_registry))).mappings().all()
        return {r["region"]: IdentityRecord(r["store_id"], int(r["generation"])) for r in rows}

    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        insert = postgresql_insert if self._postgres else sqlite_insert
        statement = insert(replica_registry).values(
            region=region, store_id=record.store_id, generation=record.generation
        )
        statement = statement.on_conflict_do_update(
            index_elements=[replica_registry.c.region],
            set_={"store_id": record.store_id, "generation": record.generation},
            where=replica_registry.c.generation <= record.generation,
        )
        async with self._connection("record_identity", write=True) as conn:
            await conn.execute(statement)
            await conn.commit()

    # --- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        await self._committer.close()
        await self._writer.drop(invalidate=False)
        if self._status_reads is not None:
            await self._status_reads.close(_CLOSE_WAIT_S)
        await self._status_conn.drop(invalidate=False)
        await self._engine.dispose()


def _one_entry_per_seq(page: list[LogEntry], region: str, conversation_id: str) -> None:
    for before, after in itertools.pairwise(page):
        if after.seq <= before.seq:
            raise InvariantViolation(
                f"{region}: conversation {conversation_id!r}: seq {before.seq} at lsn "
                f"{before.lsn}, then seq {after.seq} at lsn {after.lsn}, below the commit point"
            )


class _KeptConnection:
    """One connection taken from the pool and kept between calls (the group committer's
    writer; the status reads'), in autocommit on PostgreSQL, and on SQLite, for the writer,
    taking the write lock up front. A connection the server closed meanwhile (the database
    restarted) is replaced before use; ``drop(invalidate=True)`` after a failure, when its
    state is unknown (an error or a timeout mid-statement), so the pool discards it."""

    def __init__(self, engine: AsyncEngine, *, sqlite_write: bool) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        self._sqlite_write = sqlite_write
        self._conn: AsyncConnection | None = None

    async def get(self) -> AsyncConnection:
        if self._conn is not None and self._postgres and await _closed_by_server(self._conn):
            await self.drop(invalidate=True)
        if self._conn is None:
            conn = await self._engine.connect()
            if self._postgres:
                if not self._engine.get_execution_options().get(AUTOCOMMIT_OPTION, False):
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
            elif self._sqlite_write:
                await conn.execution_options(**{SQLITE_WRITE_OPTION: True})
            self._conn = conn
        return self._conn

    async def drop(self, *, invalidate: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            if invalidate:
                await conn.invalidate()
            await conn.close()


async def _closed_by_server(conn: AsyncConnection) -> bool:
    """Whether asyncpg already saw this connection closed (a local check, no round trip)."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    return driver is None or bool(driver.is_closed())

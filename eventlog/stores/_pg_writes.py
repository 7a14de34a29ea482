"""PostgreSQL writes, and the reads a node makes per request: one statement, one round trip.

The logic lives in the PL/pgSQL functions created by migration 0001 (``convplane_append``,
``convplane_prepare``): the shard rows are locked with ``FOR UPDATE`` inside the function, so the
check-and-write is atomic against every other leader process writing the same database. The
connection runs in autocommit, so the statement's own commit is the only commit.

A group goes to asyncpg directly, not through SQLAlchemy's ``execute``: it is the one statement
a node runs hundreds of times a second, and SQLAlchemy's layers (greenlet hop, cursor adapter,
result metadata) cost about as much client CPU as asyncpg's own encoding of the whole group
(0.22 against 0.13 ms per group of 10, measured on a local server). So do the reads a node
makes per linearizable or transcript read: the shards' statuses, a page of a conversation's
entries, the store's identity. Driver errors are translated here the way
``_engine.translated`` does for SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from eventlog.errors import InvariantViolation, ReplicaUnavailable
from eventlog.model import (
    Accepted,
    IdentityMismatch,
    Mismatch,
    PageSnapshot,
    PrepareReply,
    Promised,
    Rejected,
    ShardStatus,
)
from eventlog.stores._engine import SCHEMA_MISSING
from eventlog.stores._plan import AppendRequest
from eventlog.stores._schema import (
    EMPTY_STATUS,
    ENTRY_COLUMNS,
    entry_from_row,
    status_from_row,
)
from eventlog.stores.group_commit import AppendOutcome

_APPEND = (
    "SELECT o_index, o_kind, o_value FROM convplane_append("
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
)
#: the same with the identity the caller expects the store to have and the positions to keep
#: (migration 0007)
_APPEND_AS = (
    "SELECT o_index, o_kind, o_value FROM convplane_append_as($18, "
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, "
    "$19, $20, $21, $22)"
)
_PREPARE = text("SELECT * FROM convplane_prepare(:shard, :epoch, :tail_max)")
_STATUSES = (
    "SELECT shard, promised_epoch, last_lsn, last_epoch, commit_lsn FROM shards "
    "WHERE shard = ANY($1::integer[])"
)

#: what a store's identity is made of (``store_identity``): its identity rows (the migration
#: writes one), the migration's store id, the database's oid
_IDENTITY_COLUMNS = (
    "(SELECT count(*) FROM replica_identity) AS identity_rows, "
    "(SELECT min(store_id) FROM replica_identity) AS store_id, "
    "(SELECT oid FROM pg_database WHERE datname = current_database()) AS oid"
)
#: a page of a conversation's committed entries, in the order of ``ix_entries_conversation``,
#: with the store's identity and the shard's row as of the same snapshot: one statement
#: (``SqlReplicaStore.read_page_snapshot``). Every row carries the identity and the shard's
#: columns; an empty page is one row with no entry (``lsn`` null). The page is a LATERAL
#: subquery so that it stays an index scan that stops at ``$6`` rows; the outer sort sees only
#: the page.
_CONVERSATION_PAGE = (
    f"SELECT {_IDENTITY_COLUMNS}, s.promised_epoch, s.last_lsn, s.last_epoch, s.commit_lsn, "
    f"{', '.join('p.' + column for column in ENTRY_COLUMNS)} "
    "FROM (SELECT 1) AS one "
    "LEFT JOIN shards AS s ON s.shard = $1 "
    f"LEFT JOIN LATERAL (SELECT {', '.join(ENTRY_COLUMNS)} FROM entries "
    "WHERE shard = $1 AND tenant_id = $2 AND conversation_id = $3 AND seq > $4 AND lsn <= $5 "
    "ORDER BY seq LIMIT $6) AS p ON true "
    "ORDER BY p.seq"
)
#: the migration's store id and the database's oid, in one round trip
_IDENTITY = f"SELECT {_IDENTITY_COLUMNS}"

_ACCEPTED, _REJECTED, _MISMATCH, _VIOLATION, _IDENTITY_MISMATCH = 0, 1, 2, 3, 4
#: SQLSTATE classes that mean our statement or its values are wrong (a bug, not an outage):
#: data exception, integrity constraint violation, syntax error or access rule violation
_BUG_CLASSES = frozenset({"22", "23", "42"})


def append_arrays(requests: Sequence[AppendRequest]) -> list[list[Any]]:
    """The group as ``convplane_append``'s 17 parallel arrays, in its parameter order: one
    element per request (shard .. count), then all entries flattened (lsn .. body)."""
    arrays: list[list[Any]] = [[] for _ in range(17)]
    (
        b_shard,
        b_epoch,
        b_prev_lsn,
        b_prev_epoch,
        b_leader_commit,
        b_count,
        e_lsn,
        e_epoch,
        e_tenant,
        e_conversation,
        e_seq,
        e_type,
        e_idempotency,
        e_attempt,
        e_tokens,
        e_created,
        e_body,
    ) = arrays
    for r in requests:
        b_shard.append(r.shard)
        b_epoch.append(r.epoch)
        b_prev_lsn.append(r.prev_lsn)
        b_prev_epoch.append(r.prev_epoch)
        b_leader_commit.append(r.leader_commit_lsn)
        b_count.append(len(r.entries))
        for e in r.entries:
            e_lsn.append(e.lsn)
            e_epoch.append(e.epoch)
            e_tenant.append(e.tenant_id)
            e_conversation.append(e.conversation_id)
            e_seq.append(e.seq)
            e_type.append(e.event_type)
            e_idempotency.append(e.idempotency_key)
            e_attempt.append(e.attempt_id)
            e_tokens.append(e.token_count)
            e_created.append(e.created_at_ms)
            e_body.append(e.body)
    return arrays


async def append_group(
    conn: AsyncConnection, region: str, requests: Sequence[AppendRequest]
) -> list[AppendOutcome]:
    """One statement per expected identity in the group (a node's leaders all name the one
    its sweep vouched for, so nearly always one), in the group's order otherwise."""
    outcomes: dict[int, AppendOutcome] = {}
    for expected in dict.fromkeys(r.expected_store_id for r in requests):
        part = [i for i, r in enumerate(requests) if r.expected_store_id == expected]
        replies = await _append_part(conn, region, [requests[i] for i in part], expected)
        outcomes.update(zip(part, replies, strict=True))
    return [outcomes[i] for i in range(len(requests))]


async def _append_part(
    conn: AsyncConnection,
    region: str,
    requests: Sequence[AppendRequest],
    expected_store_id: str | None,
) -> list[AppendOutcome]:
    arrays = append_arrays(requests)
    positions = [
        (r.shard, held_region, p.epoch, p.lsn) for r in requests for held_region, p in r.positions
    ]
    if expected_store_id is None and not positions:
        result = await _fetch(conn, region, "append", _APPEND, *arrays)
    else:
        columns = [list(column) for column in zip(*positions, strict=True)] or [[], [], [], []]
        result = await _fetch(
            conn, region, "append", _APPEND_AS, *arrays, expected_store_id, *columns
        )
    rows = sorted((int(i), int(k), int(v)) for i, k, v in result)
    if [index for index, _, _ in rows] != list(range(len(requests))):
        raise InvariantViolation(f"convplane_append answered {len(rows)} of {len(requests)}")
    outcomes: list[AppendOutcome] = []
    for (_, kind, value), request in zip(rows, requests, strict=True):
        if kind == _ACCEPTED:
            outcomes.append(Accepted(value))
        elif kind == _REJECTED:
            outcomes.append(Rejected(value))
        elif kind == _MISMATCH:
            outcomes.append(Mismatch(value))
        elif kind == _IDENTITY_MISMATCH:
            outcomes.append(IdentityMismatch())
        elif kind == _VIOLATION:
            outcomes.append(
                InvariantViolation(
                    f"{region}: shard {request.shard} would truncate committed lsn {value}"
                )
            )
        else:
            raise InvariantViolation(f"convplane_append: unknown reply kind {kind}")
    return outcomes


async def statuses(
    conn: AsyncConnection, region: str, shard_ids: list[int]
) -> dict[int, ShardStatus]:
    """Shards' rows (a shard with none: never prepared), through asyncpg directly: the reads
    every node makes several times a second per replica (the control shard's followers,
    read-index rounds), where SQLAlchemy's execute cost ~6 x asyncpg's own (0.51 against
    0.085 CPU-ms, a local server)."""
    rows = await _fetch(conn, region, "status", _STATUSES, shard_ids)
    found = {int(row["shard"]): status_from_row(row) for row in rows}
    return {shard: found.get(shard, EMPTY_STATUS) for shard in shard_ids}


async def conversation_page(
    conn: AsyncConnection,
    region: str,
    key: tuple[int, str, str],
    after_seq: int,
    limit: int,
    max_lsn: int,
) -> PageSnapshot:
    """A page of the conversation's entries (``key``: shard, tenant, conversation) at or
    below ``max_lsn``, in seq order, with the store's identity and the shard's status from the
    same snapshot."""
    shard, tenant_id, conversation_id = key
    rows = await _fetch(
        conn,
        region,
        "read_conversation",
        _CONVERSATION_PAGE,
        shard,
        tenant_id,
        conversation_id,
        after_seq,
        max_lsn,
        max(limit, 0),
    )
    first = rows[0]  # the query's outer side is one row: there is always one
    status = EMPTY_STATUS if first["last_lsn"] is None else status_from_row(first)
    entries = [entry_from_row(row) for row in rows if row["lsn"] is not None]
    return PageSnapshot(entries, store_identity(region, first), status)


def store_identity(region: str, row: Any) -> str:
    """The store's identity (``SqlReplicaStore.identity``) from a row of its
    ``identity_rows``, ``store_id`` and ``oid``: the migration wrote one identity row, and a
    store with none (or several) does not have all of its schema."""
    if row["identity_rows"] != 1:
        raise ReplicaUnavailable(f"replica {region} has {row['identity_rows']} identity rows")
    return f"{row['store_id']}/db{row['oid']}"


async def identity(conn: AsyncConnection, region: str) -> str:
    """The store's identity (``SqlReplicaStore.identity``), in one round trip."""
    return store_identity(region, (await _fetch(conn, region, "identity", _IDENTITY))[0])


async def _fetch(conn: AsyncConnection, region: str, what: str, query: str, *args: Any) -> Any:
    """``query``'s rows, through the connection's asyncpg connection."""
    driver = (await conn.get_raw_connection()).driver_connection
    if driver is None:
        raise ReplicaUnavailable(f"replica {region}: the {what} connection is gone")
    try:
        return await driver.fetch(query, *args)
    except _DRIVER_ERRORS as error:
        raise _driver_error(region, error, what) from error


#: what asyncpg raises for a call the server or the connection failed (its protocol and
#: internal client errors are neither of the first two: SQLAlchemy wrapped them, a direct call
#: must too)
_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def _driver_error(
    region: str, error: Exception, what: str = "append"
) -> InvariantViolation | ReplicaUnavailable:
    """asyncpg's error as ours: values or SQL of ours the server (or the driver, encoding a
    parameter) refused are a bug; everything else means the replica could not answer."""
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(error, asyncpg.PostgresError) and sqlstate not in SCHEMA_MISSING:
        if isinstance(sqlstate, str) and sqlstate[:2] in _BUG_CLASSES:
            return InvariantViolation(f"{region}: {what}: {type(error).__name__}: {error}")
    if isinstance(error, asyncpg.InterfaceError) and isinstance(error, ValueError):
        return InvariantViolation(f"{region}: {what}: parameters not encodable: {error}")
    return ReplicaUnavailable(
        f"replica {region} unavailable during {what}: {type(error).__name__}: {error}"
    )


async def prepare(conn: AsyncConnection, shard: int, epoch: int, tail_max: int) -> PrepareReply:
    result = await conn.execute(_PREPARE, {"shard": shard, "epoch": epoch, "tail_max": tail_max})
    rows = list(result.mappings())
    head = next(r for r in rows if r["lsn"] is None)  # the status row; the rest is the tail
    if not head["o_ok"]:
        return Rejected(head["o_promised"])
    status = ShardStatus(
        head["o_promised"], head["o_last_lsn"], head["o_last_epoch"], head["o_commit"]
    )
    found = (entry_from_row(r) for r in rows if r["lsn"] is not None)
    tail = tuple(sorted(found, key=lambda e: e.lsn))
    return Promised(status, tail, status.commit_lsn + len(tail) >= status.last_lsn)

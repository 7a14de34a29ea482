"""SQLite writes: the pure plan (``_plan``) applied inside one BEGIN IMMEDIATE transaction.

BEGIN IMMEDIATE takes SQLite's write lock before the first read, so the read-check-write of a
group is atomic against every other connection and process on the same file (fencing holds even
with two leader processes sharing one database). The commit is the group's only fsync.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from eventlog.errors import InvariantViolation
from eventlog.model import Accepted, IdentityMismatch, PrepareReply, Promised, Rejected, ShardStatus
from eventlog.stores._plan import AppendRequest, plan_append
from eventlog.stores._schema import (
    entries,
    entry_from_row,
    entry_to_row,
    replica_positions,
    shards,
    status_from_row,
)
from eventlog.stores.group_commit import AppendOutcome

#: reads the store's identity on the given connection (``SqlReplicaStore.identity``)
IdentityOf = Callable[[AsyncConnection], Awaitable[str]]


async def append_group(
    conn: AsyncConnection,
    region: str,
    requests: Sequence[AppendRequest],
    identity_of: IdentityOf,
) -> list[AppendOutcome]:
    """The group in one transaction; the store's identity, when a request names the one it
    expects, read inside it (under the write lock, so nothing replaces the store between the
    check and the writes)."""
    async with conn.begin():
        found = None
        if any(r.expected_store_id is not None for r in requests):
            found = await identity_of(conn)
        return [
            IdentityMismatch()
            if request.expected_store_id not in (None, found)
            else await _append_one(conn, region, request)
            for request in requests
        ]


async def prepare(conn: AsyncConnection, shard: int, epoch: int, tail_max: int) -> PrepareReply:
    async with conn.begin():
        row = await _shard_row(conn, shard)
        current = status_from_row(row)
        if epoch <= current.promised_epoch:
            return Rejected(current.promised_epoch)
        status = ShardStatus(epoch, current.last_lsn, current.last_epoch, current.commit_lsn)
        await _write_status(conn, shard, status, exists=row is not None)
        tail_rows = await conn.execute(
            select(entries)
            .where(entries.c.shard == shard, entries.c.lsn > status.commit_lsn)
            .order_by(entries.c.lsn)
            .limit(max(tail_max, 0))
        )
        tail = tuple(entry_from_row(r) for r in tail_rows.mappings())
    return Promised(status, tail, status.commit_lsn + len(tail) >= status.last_lsn)


async def _append_one(conn: AsyncConnection, region: str, request: AppendRequest) -> AppendOutcome:
    row = await _shard_row(conn, request.shard)
    current = status_from_row(row)
    lo_lsn, hi_lsn = request.prev_lsn, request.prev_lsn + len(request.entries)
    stored = await conn.execute(
        select(entries.c.lsn, entries.c.epoch).where(
            entries.c.shard == request.shard, entries.c.lsn >= lo_lsn, entries.c.lsn <= hi_lsn
        )
    )
    plan = plan_append(current, {lsn: epoch for lsn, epoch in stored}, request)
    if plan.truncate_from_lsn is not None:
        await conn.execute(
            delete(entries).where(
                entries.c.shard == request.shard, entries.c.lsn >= plan.truncate_from_lsn
            )
        )
    if plan.inserts:
        await conn.execute(insert(entries), [entry_to_row(request.shard, e) for e in plan.inserts])
    if plan.status != current:
        await _write_status(conn, request.shard, plan.status, exists=row is not None)
    if plan.violation is not None:
        return InvariantViolation(f"{region}: {plan.violation}")
    if isinstance(plan.reply, Accepted):
        await _keep_positions(conn, request)
    return plan.reply


async def _keep_positions(conn: AsyncConnection, request: AppendRequest) -> None:
    """Raise the shard's kept positions to the request's, region by region."""
    for region, position in request.positions:
        statement = sqlite_insert(replica_positions).values(
            shard=request.shard, region=region, epoch=position.epoch, lsn=position.lsn
        )
        excluded = statement.excluded
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=[replica_positions.c.shard, replica_positions.c.region],
                set_={"epoch": excluded.epoch, "lsn": excluded.lsn},
                where=tuple_(excluded.epoch, excluded.lsn)
                > tuple_(replica_positions.c.epoch, replica_positions.c.lsn),
            )
        )


async def _shard_row(conn: AsyncConnection, shard: int) -> Mapping[Any, Any] | None:
    result = await conn.execute(select(shards).where(shards.c.shard == shard))
    return result.mappings().first()


async def _write_status(
    conn: AsyncConnection, shard: int, status: ShardStatus, *, exists: bool
) -> None:
    values = {
        "promised_epoch": status.promised_epoch,
        "commit_lsn": status.commit_lsn,
        "last_lsn": status.last_lsn,
        "last_epoch": status.last_epoch,
    }
    if exists:
        await conn.execute(update(shards).where(shards.c.shard == shard).values(**values))
    else:
        await conn.execute(insert(shards).values(shard=shard, **values))

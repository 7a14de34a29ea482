"""PostgreSQL writes: one statement, one round trip, per group and per prepare.

The logic lives in the PL/pgSQL functions created by migration 0001 (``convplane_append``,
``convplane_prepare``): the shard rows are locked with ``FOR UPDATE`` inside the function, so the
check-and-write is atomic against every other leader process writing the same database. The
connection runs in autocommit, so the statement's own commit is the only commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from eventlog.errors import InvariantViolation
from eventlog.model import Accepted, Mismatch, PrepareReply, Promised, Rejected, ShardStatus
from eventlog.stores._plan import AppendRequest
from eventlog.stores._schema import entry_from_row
from eventlog.stores.group_commit import AppendOutcome

_APPEND = text(
    "SELECT o_index, o_kind, o_value FROM convplane_append("
    ":b_shard, :b_epoch, :b_prev_lsn, :b_prev_epoch, :b_leader_commit, :b_count, "
    ":e_lsn, :e_epoch, :e_tenant, :e_conversation, :e_seq, :e_type, :e_idempotency, :e_attempt, "
    ":e_tokens, :e_created, :e_body)"
)
_PREPARE = text("SELECT * FROM convplane_prepare(:shard, :epoch, :tail_max)")

_ACCEPTED, _REJECTED, _MISMATCH, _VIOLATION = 0, 1, 2, 3


def append_params(requests: Sequence[AppendRequest]) -> dict[str, list[Any]]:
    """The group as parallel arrays: one element per request, then all entries flattened."""
    params: dict[str, list[Any]] = {
        name: []
        for name in (
            "b_shard b_epoch b_prev_lsn b_prev_epoch b_leader_commit b_count e_lsn e_epoch e_tenant "
            "e_conversation e_seq e_type e_idempotency e_attempt e_tokens e_created e_body"
        ).split()
    }
    for r in requests:
        params["b_shard"].append(r.shard)
        params["b_epoch"].append(r.epoch)
        params["b_prev_lsn"].append(r.prev_lsn)
        params["b_prev_epoch"].append(r.prev_epoch)
        params["b_leader_commit"].append(r.leader_commit_lsn)
        params["b_count"].append(len(r.entries))
        for e in r.entries:
            params["e_lsn"].append(e.lsn)
            params["e_epoch"].append(e.epoch)
            params["e_tenant"].append(e.tenant_id)
            params["e_conversation"].append(e.conversation_id)
            params["e_seq"].append(e.seq)
            params["e_type"].append(e.event_type)
            params["e_idempotency"].append(e.idempotency_key)
            params["e_attempt"].append(e.attempt_id)
            params["e_tokens"].append(e.token_count)
            params["e_created"].append(e.created_at_ms)
            params["e_body"].append(e.body)
    return params


async def append_group(
    conn: AsyncConnection, region: str, requests: Sequence[AppendRequest]
) -> list[AppendOutcome]:
    result = await conn.execute(_APPEND, append_params(requests))
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
        elif kind == _VIOLATION:
            outcomes.append(
                InvariantViolation(
                    f"{region}: shard {request.shard} would truncate committed lsn {value}"
                )
            )
        else:
            raise InvariantViolation(f"convplane_append: unknown reply kind {kind}")
    return outcomes


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

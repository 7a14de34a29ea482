"""Independent audit of a chaos run: reads every PostgreSQL replica directly (asyncpg, not the
project's stores) and checks what the log promises.

* Every acknowledged event is on a quorum of replicas, and in the committed prefix.
* Exactly once, in order: in each replica's committed prefix a conversation's seqs run 0, 1, 2,
  ... in lsn order with no duplicate, and an Idempotency-Key (or a tool attempt's id) appears at
  most once.
* The acknowledged seq holds the acknowledged key or attempt (the ack told the truth).
* One leader per (shard, epoch): every barrier entry of an epoch names the same region, on every
  replica; and two replicas' entries at the same (shard, lsn, epoch) are the same entry.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from eventlog.model import LEADER_BARRIER
from tests.harness.chaos import Ack, ChaosPlane, Writers, pg_dsn

#: the conversation shards only (the control shard has no conversations but is audited too)


@dataclass
class AuditReport:
    replicas: int = 0
    entries_read: int = 0
    acked: int = 0
    acked_lost: int = 0
    leader_epochs: int = 0
    #: (shard, epoch) -> (region, wall ms the leader started), from the barrier entries
    leaders: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict, repr=False)
    problems: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(message)


async def read_replica(dsn: str) -> tuple[dict[int, int], list[dict[str, Any]]]:
    conn = await asyncpg.connect(pg_dsn(dsn), timeout=30)
    try:
        shards = {
            r["shard"]: r["commit_lsn"]
            for r in await conn.fetch("SELECT shard, commit_lsn FROM shards")
        }
        rows = [
            dict(r)
            for r in await conn.fetch(
                "SELECT shard, lsn, epoch, tenant_id, conversation_id, seq, event_type, "
                "idempotency_key, body, created_at_ms "
                "FROM entries ORDER BY shard, lsn"
            )
        ]
    finally:
        await conn.close(timeout=30)
    return shards, rows


async def audit(dsns: dict[str, str], acks: list[Ack]) -> AuditReport:
    report = AuditReport(replicas=len(dsns), acked=len(acks))
    data = {region: await read_replica(dsn) for region, dsn in dsns.items()}
    report.entries_read = sum(len(rows) for _, rows in data.values())
    _check_leaders(data, report)
    _check_log_matching(data, report)
    committed = {region: _committed(shards, rows) for region, (shards, rows) in data.items()}
    for region, rows in committed.items():
        _check_order(region, rows, report)
    _check_acks(data, committed, acks, report)
    return report


def _committed(commit: dict[int, int], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["lsn"] <= commit.get(r["shard"], 0)]


def _check_leaders(data: dict[str, Any], report: AuditReport) -> None:
    leaders: dict[tuple[int, int], set[str]] = defaultdict(set)
    for _, rows in data.values():
        for r in rows:
            if r["event_type"] == LEADER_BARRIER:
                region = json.loads(r["body"])["region"]
                leaders[(r["shard"], r["epoch"])].add(region)
                report.leaders[(r["shard"], r["epoch"])] = (region, r["created_at_ms"])
    report.leader_epochs = len(leaders)
    for (shard, epoch), regions in sorted(leaders.items()):
        if len(regions) != 1:
            report.fail(f"shard {shard} epoch {epoch}: barriers of {sorted(regions)}")


def _check_log_matching(data: dict[str, Any], report: AuditReport) -> None:
    seen: dict[tuple[int, int, int], tuple[str, str]] = {}
    for region, (_, rows) in data.items():
        for r in rows:
            key = (r["shard"], r["lsn"], r["epoch"])
            other = seen.setdefault(key, (region, r["body"]))
            if other[1] != r["body"]:
                report.fail(
                    f"shard {key[0]} lsn {key[1]} epoch {key[2]}: {other[0]} and "
                    f"{region} hold different entries"
                )


#: how an ack names a tool event sent without an Idempotency-Key (``chaos.Ack.key``)
_TOOL_EVENTS = {"tool.attempt": "attempt", "tool.effect": "effect"}


def entry_identity(row: dict[str, Any]) -> str | None:
    """What an ack names an entry by (``chaos.Ack.key``): its Idempotency-Key, or
    ``attempt:<attempt_id>`` (``effect:<attempt_id>``) for a tool attempt (effect) without one."""
    if row["idempotency_key"] is not None:
        return str(row["idempotency_key"])
    kind = _TOOL_EVENTS.get(row["event_type"])
    if kind is not None:
        return f"{kind}:{json.loads(row['body'])['payload']['attempt_id']}"
    return None


def _check_order(region: str, rows: list[dict[str, Any]], report: AuditReport) -> None:
    """Gapless seqs and one entry per idempotency key or tool attempt, per conversation: keyed by tenant and id
    (conversation ids are namespaced by tenant, so one id of two tenants is two sequences)."""
    last_seq: dict[tuple[str, str], int] = {}
    keys: set[tuple[tuple[str, str], str]] = set()
    for r in rows:
        if not r["conversation_id"]:
            continue  # barriers and control records
        cid = (r["tenant_id"], r["conversation_id"])
        expected = last_seq.get(cid, -1) + 1
        if r["seq"] != expected:
            report.fail(f"{region}: {cid} seq {r['seq']} at lsn {r['lsn']}, expected {expected}")
        last_seq[cid] = r["seq"]
        identity = entry_identity(r)
        if identity is not None:
            if (cid, identity) in keys:
                report.fail(f"{region}: {cid} key {identity} committed twice")
            keys.add((cid, identity))


def _check_acks(
    data: dict[str, Any],
    committed: dict[str, list[dict[str, Any]]],
    acks: list[Ack],
    report: AuditReport,
) -> None:
    holders: dict[tuple[str, int], dict[str, str | None]] = defaultdict(dict)
    for region, (_, rows) in data.items():
        for r in rows:
            if r["conversation_id"]:
                holders[(r["conversation_id"], r["seq"])][region] = entry_identity(r)
    in_prefix = {
        (r["conversation_id"], r["seq"], entry_identity(r))
        for rows in committed.values()
        for r in rows
    }
    quorum = len(data) // 2 + 1
    for a in acks:
        held = [
            reg for reg, key in holders.get((a.conversation_id, a.seq), {}).items() if key == a.key
        ]
        ok = len(held) >= quorum and (a.conversation_id, a.seq, a.key) in in_prefix
        if not ok:
            report.acked_lost += 1
            report.fail(
                f"acked {a.conversation_id} seq {a.seq} key {a.key} "
                f"held by {held}, committed prefix: "
                f"{(a.conversation_id, a.seq, a.key) in in_prefix}"
            )


async def audit_after_writers(
    plane: ChaosPlane, writers: Writers, running: asyncio.Task[None]
) -> AuditReport:
    """Let the writers finish their last appends, stop the nodes (so nothing changes under the
    audit), then audit every region's database."""
    writers.stop.set()
    await asyncio.wait_for(running, 60)
    await asyncio.to_thread(plane.stop_nodes)
    return await audit({m.name: plane.owner_dsn(m) for m in plane.members}, writers.acks)

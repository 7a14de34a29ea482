"""Security issue 39, finding 6: an operator could push earlier actions out of the audit log by
posting entries (only the newest 10,000 were readable, and nothing limited ``POST /v1/audit``).
Now a page older than a node's memory window is read from the control shard, and posted
entries are rate limited per operator key (``services.control.audit_log``)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from eventlog.errors import QuotaExceeded
from eventlog.memory_replica import MemoryReplica
from regions.ops_state import (
    AUDIT_DETAIL_BYTES_MAX,
    AUDIT_KEY,
    AUDIT_RECORD,
    HALT_RECORD,
    OpsState,
    audit_body,
)
from services.control.audit_log import (
    AUDIT_POSTS_BURST,
    AUDIT_POSTS_PER_S,
    AuditPostLimiter,
    audit_page,
)
from tests.unit.clocks import ManualClock
from tests.unit.control_nodes import REGIONS, controller

FLOOD = 12
WINDOW = 5  # entries a node keeps in memory, here: the flood is more than twice that


def entry(action: str, detail: dict[str, object] | None = None) -> dict[str, object]:
    return audit_body(at_ms=1, by="sre", role="operator", action=action, target="*",
                      reason="test", detail=detail)  # fmt: skip


async def test_an_early_halt_stays_readable_after_a_flood_of_posted_entries() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, _ = controller("a", replicas)
    ops = OpsState(audit_kept_max=WINDOW)
    leader.record_listeners = [ops.apply_entry]
    await leader.node.lead_shard(leader.control_shard)
    shard = leader.control_shard
    halt = {"on": True, "reason": "stop", "by": "sre", "at_ms": 1, AUDIT_KEY: entry("halt.on")}
    await leader.node.append_record(shard, HALT_RECORD, halt)
    for n in range(FLOOD):
        await leader.node.append_record(shard, AUDIT_RECORD, entry(f"flood.{n}"))
    await leader.read_barrier()
    assert "halt.on" not in [e.action for e in ops.audit]  # pushed out of memory

    first = await audit_page(leader, ops, after=0, limit=3)
    assert [e.action for e in first] == ["halt.on", "flood.0", "flood.1"]
    rest = await audit_page(leader, ops, after=first[-1].lsn, limit=100)
    assert [e.action for e in rest] == [f"flood.{n}" for n in range(2, FLOOD)]
    newest = await audit_page(leader, ops, after=rest[-WINDOW - 1].lsn, limit=100)
    assert newest == list(ops.audit)  # the memory window answers what it holds
    await leader.node.close()


def test_posted_entries_are_limited_per_operator_key_and_counted() -> None:
    clock, registry = ManualClock(), CollectorRegistry()
    limiter = AuditPostLimiter(clock, registry)
    for _ in range(AUDIT_POSTS_BURST):
        limiter.admit("sre")
    with pytest.raises(QuotaExceeded) as refused:
        limiter.admit("sre")
    assert refused.value.retry_after_s == pytest.approx(1 / AUDIT_POSTS_PER_S)
    limiter.admit("oncall")  # another operator key has its own bucket
    clock.now_s += 1 / AUDIT_POSTS_PER_S
    limiter.admit("sre")
    counted = {o: registry.get_sample_value("convplane_audit_posts_total", {"outcome": o})
               for o in ("recorded", "rate_limited")}  # fmt: skip
    assert counted == {"recorded": AUDIT_POSTS_BURST + 2, "rate_limited": 1}


def test_an_entrys_detail_is_size_limited() -> None:
    body = entry("x", {"blob": "y" * AUDIT_DETAIL_BYTES_MAX})
    assert body["detail"] == {"truncated": True}
    assert entry("x", {"small": 1})["detail"] == {"small": 1}

"""An operator action that changes state is audited inside the control record that makes the
change (``regions.ops_state``), so the change and its audit entry commit together or not at all.

They used to be two appends to the control shard: an evacuate or restore committed its placement
and then its audit entry (a failure between them left a move nobody audited), and the halt
switch committed its audit entry and then the halt (a failure between them left an entry for a
change that never happened, and the retry wrote a second one)."""

from __future__ import annotations

import json

from eventlog.memory_replica import MemoryReplica
from regions.control import PLACEMENT_RECORD
from regions.drills import DrillSpec, start
from regions.ops_state import AUDIT_KEY, DRILL_RECORD, HALT_RECORD, OpsState, audit_body
from tests.unit.control_nodes import REGIONS, controller

T0 = 1_767_225_600_000


def audit(action: str, target: str = "b") -> dict[str, object]:
    return audit_body(at_ms=T0, by="sre", role="operator", action=action, target=target,
                      reason="maintenance")  # fmt: skip


async def test_an_evacuation_commits_one_placement_record_that_carries_its_audit_entry() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, ops = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    placement = await leader.operator("evacuate", "b", audit("region.evacuate"))
    await leader.read_barrier()
    records = await leader.node.read_committed(leader.control_shard, 0, 100)
    kinds = [r.event_type for r in records if r.event_type.startswith("control.")]
    assert kinds == [PLACEMENT_RECORD]
    assert "b" in placement.evacuated
    [entry] = ops.audit
    assert (entry.action, entry.target, entry.reason) == ("region.evacuate", "b", "maintenance")
    assert entry.lsn == records[-1].lsn  # the audit entry's cursor is its placement record
    await leader.node.close()


async def test_a_placement_record_the_controller_skips_brings_no_audit_entry() -> None:
    """A stale placement record (a deposed control leader's, built on an older version) does
    not take effect, so the move it describes did not happen and its entry must not show."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, ops = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    first = await leader.operator("evacuate", "b", audit("region.evacuate"))
    stale = {**first.to_body(), "reason": "a deposed leader's", AUDIT_KEY: audit("region.restore")}
    await leader.node.append_record(leader.control_shard, PLACEMENT_RECORD, stale)
    await leader.read_barrier()
    assert leader.state.skipped_records == 1
    assert [e.action for e in ops.audit] == ["region.evacuate"]
    await leader.node.close()


def test_a_drill_record_carries_its_audit_entry_once_and_a_stale_copy_adds_none() -> None:
    ops = OpsState()
    spec = DrillSpec(kind="region-loss", region="us-east", hold_s=10.0, reason="drill")
    body = json.dumps({**start("d1", spec, T0).to_body(), AUDIT_KEY: audit("drill.start")})
    assert ops.apply(1, DRILL_RECORD, body)
    assert not ops.apply(2, DRILL_RECORD, body)  # the same revision again: a retried append
    assert [(e.lsn, e.action) for e in ops.audit] == [(1, "drill.start")]
    assert ops.stale_records == 1 and ops.drills["d1"].rev == 1


def test_a_halt_record_carries_its_audit_entry() -> None:
    ops = OpsState()
    halt = {"on": True, "reason": "incident", "by": "sre", "at_ms": T0,
            AUDIT_KEY: audit("halt.on", "*")}  # fmt: skip
    assert ops.apply(1, HALT_RECORD, json.dumps(halt))
    assert ops.halt.on and [(e.lsn, e.action, e.target) for e in ops.audit] == [(1, "halt.on", "*")]


def test_a_malformed_audit_entry_is_counted_and_the_change_still_applies() -> None:
    ops = OpsState()
    halt = {"on": True, "reason": "incident", "by": "sre", "at_ms": T0, AUDIT_KEY: {"by": "x"}}
    assert ops.apply(1, HALT_RECORD, json.dumps(halt))
    assert ops.halt.on and not ops.audit and ops.malformed_records == 1
    # a time JSON reads as infinity: counted and skipped, never raised into the controller
    infinite = '{"on": false, "reason": "r", "by": "sre", "at_ms": 1e999}'
    assert not ops.apply(2, HALT_RECORD, infinite)
    entry = {**halt, AUDIT_KEY: {**audit("halt.on", "*"), "at_ms": float("inf")}}
    assert ops.apply(3, HALT_RECORD, json.dumps(entry))  # "Infinity": the halt still applies
    assert ops.halt.on and not ops.audit and ops.malformed_records == 3


def test_placement_records_are_audited_only_when_the_controller_applied_them() -> None:
    ops = OpsState()
    body = json.dumps({"version": 1, AUDIT_KEY: audit("region.restore")})
    assert not ops.apply(1, PLACEMENT_RECORD, body, placement_applied=False)
    assert ops.apply(2, PLACEMENT_RECORD, body, placement_applied=True)
    assert not ops.apply(3, PLACEMENT_RECORD, json.dumps({"version": 2}), placement_applied=True)
    assert [(e.lsn, e.action) for e in ops.audit] == [(2, "region.restore")]

"""The control shard is never handed to a region-loss drill's target before the drill ends.

The target learns that its black-hole lifted from the control shard (its fold of the drill
records, read from the replicas up to their commit hint). bench/drills.py caught a drill of the
control leader's own region failing this way: at restore the survivor leading the control shard
saw the target answer again and resigned in its favour, before the target had learned the
drill's restore; the target, still dropping its own writes, could not win a prepare, and the
control shard had no leader (no restore, no placement change) until the drill's deadline.
"""

from __future__ import annotations

import asyncio
import json

from eventlog.memory_replica import MemoryReplica
from regions.drills import DrillSpec, start
from regions.ops_state import AUDIT_RECORD, DRILL_RECORD, OpsState
from tests.unit.control_nodes import REGIONS, controller
from tests.unit.test_leader_fail_fast import BlackHole


def drill_body(kind: str, region: str, phase: str, rev: int = 1) -> dict[str, object]:
    drill = start("d1", DrillSpec(kind=kind, region=region, hold_s=5.0, reason="test"), 1_000)  # type: ignore[arg-type]
    return {**drill.to_body(), "phase": phase, "rev": rev}


async def test_the_target_of_an_active_region_loss_drill_never_leads_the_control_shard() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    a, ops = controller("a", replicas)
    assert a.control_leader() == "a"  # the lowest name
    await a.node.lead_shard(a.control_shard)
    for phase in ("injecting", "holding", "restoring"):
        lsn = await a.node.append_record(
            a.control_shard, DRILL_RECORD, drill_body("region-loss", "a", phase)
        )
        await a.read_barrier()
        assert ops.applied_lsn == lsn and ops.region_loss_targets() == {"a"}
        assert a.control_leader() == "b", phase
    await a._control()  # the target hands the control shard to a survivor
    assert not a.node.leads(a.control_shard)
    await a.node.close()

    b, ops_b = controller("b", replicas)
    await b._learn()
    assert ops_b.region_loss_targets() == {"a"}
    await b._control()  # b leads it now, though a is alive and its name is lower
    assert b._control_leading is not None
    await b._control_leading
    assert b.node.leads(b.control_shard)
    await b.node.close()


def test_only_region_loss_drills_that_have_not_ended_exclude_their_target() -> None:
    for kind, phase, excluded in (
        ("region-loss", "planned", {"a"}),
        ("region-loss", "done", set()),
        ("region-loss", "aborted", set()),
        ("evacuate", "holding", set()),
        ("kill", "restoring", set()),
    ):
        ops = OpsState()
        assert ops.apply(1, DRILL_RECORD, json.dumps(drill_body(kind, "a", phase)))
        assert ops.region_loss_targets() == excluded, (kind, phase)


async def test_a_survivor_that_hands_the_control_shard_back_publishes_the_drills_end_first() -> (
    None
):
    """The e2e drill tests caught the mirror case of the one above (CI, 10 failed tests): the
    survivor leading the control shard committed the drill's end, learned it, and resigned in
    the target's favour before any replica's commit hint covered that record. The target,
    learning only up to those hints, still saw its drill active and deferred to the survivor,
    which deferred to it: nobody led the control shard again, and nothing could commit the
    record that would have ended the standoff."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    # no hint moves by lingering within the test, however slow the machine
    b, ops_b = controller("b", replicas, commit_push_delay_s=3600.0)
    await b.node.lead_shard(b.control_shard)
    await b.node.append_record(
        b.control_shard, DRILL_RECORD, drill_body("region-loss", "a", "restoring")
    )
    await b.read_barrier()
    assert b.control_leader() == "b"
    await b.node.append_record(
        b.control_shard, DRILL_RECORD, drill_body("region-loss", "a", "done", rev=2)
    )
    await b.read_barrier()
    assert ops_b.region_loss_targets() == set() and b.control_leader() == "a"
    await b._control()  # the survivor hands the control shard back to the target
    assert not b.node.leads(b.control_shard)

    a, ops_a = controller("a", replicas)
    await a._learn()  # from the replicas' commit hints, as a node that does not lead learns
    assert ops_a.region_loss_targets() == set()
    assert a.control_leader() == "a"
    await a.node.close()
    await b.node.close()


async def test_a_control_leader_hands_the_shard_over_only_once_a_quorum_holds_its_commit() -> None:
    """Bug 3's rule (issue 32): the survivor leading the control shard hands it back only once
    a write quorum of replicas' commit hints holds everything it committed. Here its push to
    ``a`` and ``c`` is lost (their appends hang): ``publish_commit`` ends at its bound, or sees
    both suspected and returns, and the old resign went ahead anyway, leaving a record only
    ``b`` knew. ``b`` keeps the shard instead, and hands it over once the push lands (the
    leader's own push, lingering 0.02 s, is the one cut off: nothing waits in between)."""
    replicas: dict[str, MemoryReplica] = {"a": BlackHole("a"), "b": MemoryReplica("b"),
                                          "c": BlackHole("c")}  # fmt: skip
    b, _ = controller("b", replicas)
    await b.node.lead_shard(b.control_shard)
    await b.node.append_record(
        b.control_shard, DRILL_RECORD, drill_body("region-loss", "a", "done")
    )
    await b.read_barrier()
    assert b.control_leader() == "a"
    last = await b.node.append_record(b.control_shard, AUDIT_RECORD, {"note": "after the end"})
    for store in (replicas["a"], replicas["c"]):
        assert isinstance(store, BlackHole)
        store.cut = True
    await b._control()  # the push is lost: b keeps leading
    assert b.node.leads(b.control_shard)
    for store in (replicas["a"], replicas["c"]):
        assert isinstance(store, BlackHole)
        store.cut = False
    await asyncio.sleep(3)  # the lost calls time out; the leader's next push lands
    await b._control()  # b hands the shard over
    assert not b.node.leads(b.control_shard)
    assert [(await replicas[r].status(b.control_shard)).commit_lsn >= last for r in "ac"] == [
        True,
        True,
    ]
    await b.node.close()

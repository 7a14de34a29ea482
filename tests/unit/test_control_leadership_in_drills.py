"""The control shard is never handed to a region-loss drill's target before the drill ends.

The target learns that its black-hole lifted from the control shard (its fold of the drill
records, read from the replicas up to their commit hint). bench/drills.py caught a drill of the
control leader's own region failing this way: at restore the survivor leading the control shard
saw the target answer again and resigned in its favour, before the target had learned the
drill's restore; the target, still dropping its own writes, could not win a prepare, and the
control shard had no leader (no restore, no placement change) until the drill's deadline.
"""

from __future__ import annotations

import json

from eventlog.memory_replica import MemoryReplica
from regions.drills import DrillSpec, start
from regions.ops_state import DRILL_RECORD, OpsState
from tests.unit.control_nodes import REGIONS, controller


def drill_body(kind: str, region: str, phase: str) -> dict[str, object]:
    drill = start("d1", DrillSpec(kind=kind, region=region, hold_s=5.0, reason="test"), 1_000)  # type: ignore[arg-type]
    return {**drill.to_body(), "phase": phase}


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

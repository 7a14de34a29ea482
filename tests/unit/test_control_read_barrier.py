"""``Controller.read_barrier``: reads of the control shard's state (drills, halt, audit) see every
record committed before they began, at the control leader, and are sent there from elsewhere.

A CI run caught the bug this guards: ``convplane keys create`` recorded its audit entry (the
control leader committed it), and the audit log read right after at the node the CLI had called
did not show it yet, because that node answered from its own fold, a poll behind the leader."""

from __future__ import annotations

import asyncio

import pytest

from eventlog.errors import NoQuorum, NotLeader
from eventlog.memory_replica import MemoryReplica
from eventlog.model import LogEntry
from regions.ops_state import AUDIT_RECORD, audit_body
from services.control.controller import LEARN_READ_DEADLINE_S
from tests.unit.control_nodes import REGIONS, controller


def audit(action: str) -> dict[str, object]:
    return audit_body(at_ms=1, by="sre", role="operator", action=action, target="t", reason="r",
                      detail=None)  # fmt: skip


async def test_the_leader_applies_every_committed_record_before_a_read() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, ops = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    # committed by the leader's drill driver, not yet learned by its fold
    lsns = [
        await leader.node.append_record(leader.control_shard, AUDIT_RECORD, audit(f"act.{i}"))
        for i in range(3)
    ]
    assert [e.action for e in ops.audit] == []
    await leader.read_barrier()
    assert leader.state.applied_lsn == ops.applied_lsn == lsns[-1]
    assert [e.action for e in ops.audit] == ["act.0", "act.1", "act.2"]
    await leader.node.close()


async def test_a_node_that_does_not_lead_the_control_shard_names_the_one_that_does() -> None:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, _ = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    await leader.node.append_record(leader.control_shard, AUDIT_RECORD, audit("act"))
    follower, ops = controller("b", replicas)
    with pytest.raises(NotLeader) as refused:
        await follower.read_barrier()
    assert refused.value.leader_region == follower.control_leader()
    assert refused.value.shard == follower.control_shard and list(ops.audit) == []
    await leader.node.close()
    await follower.node.close()


async def test_a_stuck_read_of_control_records_gives_up_and_frees_the_fold() -> None:
    """A read of new control records that never returns (a bug below, like the read-index
    round this guards against since stop 21) fails at LEARN_READ_DEADLINE_S instead of holding
    the fold's lock for good: the next learn runs and applies what was committed. (Virtual
    time: the unit tier's loop.)"""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, ops = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    lsn = await leader.node.append_record(leader.control_shard, AUDIT_RECORD, audit("act"))
    real_read = leader._read_control
    stuck = asyncio.get_running_loop().create_future()

    async def hangs_once() -> list[LogEntry]:
        leader._read_control = real_read  # type: ignore[method-assign]
        await stuck  # never resolved
        return []

    leader._read_control = hangs_once  # type: ignore[method-assign]
    started_s = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):  # (without the deadline: wait_for's, 3x later)
        await asyncio.wait_for(leader._learn(), 3 * LEARN_READ_DEADLINE_S)
    assert asyncio.get_running_loop().time() - started_s == pytest.approx(
        LEARN_READ_DEADLINE_S, abs=0.01
    )
    await leader._learn()
    assert ops.applied_lsn == lsn
    await leader.node.close()


async def test_a_fold_whose_leadership_check_is_cut_short_by_a_fence_ends_and_frees_its_lock() -> (
    None
):
    """Stop 20's CI failure, at the level it failed: the control leader's fold is inside its
    leadership check when a newer leader fences it, before the check's round ran a step. The
    fold must end (retryable) and leave its lock free, so the next learn runs; it used to wait
    for good, and that node never learned another control record."""
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    leader, _ops = controller("a", replicas)
    await leader.node.lead_shard(leader.control_shard)
    shard_leader = leader.node.leader(leader.control_shard)
    assert shard_leader is not None
    fold = asyncio.ensure_future(leader._learn())
    # runs after the fold's first step (which creates the round), before the round's first
    asyncio.get_running_loop().call_soon(shard_leader.stop, shard_leader.epoch + 1)
    for _ in range(20):
        await asyncio.sleep(0)
    assert fold.done(), "the fold still waits on a round that was cancelled before it ran"
    assert isinstance(fold.exception(), NoQuorum)
    assert not leader._learn_lock.locked()
    await leader.node.close()

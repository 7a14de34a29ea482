"""A leader cut off from its quorum answers NoQuorum early instead of hanging to its timeout.

Runs on the simulator's virtual-time loop, so "early" is measured in virtual seconds: the test
is deterministic and does not depend on this machine's speed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.errors import NoQuorum
from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply, LogEntry
from eventlog.node import LogNode
from eventlog.sim.loop import VirtualTimeLoop


class BlackHole(MemoryReplica):
    """A replica behind a partition that swallows requests: calls never return."""

    cut = False

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
    ) -> AppendReply:
        if self.cut:
            await asyncio.sleep(3600)
        return await super().append(shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn)


T = TypeVar("T")


def run(coro_fn: Callable[[bool], Coroutine[Any, Any, T]], *args: bool) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro_fn(*args))
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


async def cut_off_append(detector_knows: bool) -> float:
    config = LogConfig(
        shard_count=1,
        append_timeout_s=30.0,
        replica_call_timeout_s=10.0,
        replica_suspect_after_s=1.0,
    )
    replicas = {"a": MemoryReplica("a"), "b": BlackHole("b"), "c": BlackHole("c")}
    node = LogNode(
        region="a", replicas=replicas, config=config, clock=LoopClock(), rng=random.Random(1)
    )
    await node.lead_shard(0)
    await node.create_conversation("t", "c1", "m", {})
    replicas["b"].cut = replicas["c"].cut = True  # type: ignore[attr-defined]
    if detector_knows:
        node.set_region_health(lambda region: region in ("b", "c"))
    started = asyncio.get_running_loop().time()
    with pytest.raises(NoQuorum, match="outcome is unknown"):
        await node.append_event("t", "c1", "note", {"n": 1})
    waited_s = asyncio.get_running_loop().time() - started
    # the next append is refused before anything is written
    with pytest.raises(NoQuorum, match="reachable"):
        await node.append_event("t", "c1", "note", {"n": 2})
    await node.close()
    return waited_s


def test_silent_replicas_count_as_unreachable_after_the_suspect_time() -> None:
    waited_s = run(cut_off_append, False)
    assert 1.0 <= waited_s < 2.0  # not the 10 s call timeout nor the 30 s append timeout


def test_failure_detector_makes_a_cut_off_leader_give_up_at_once() -> None:
    waited_s = run(cut_off_append, True)
    assert waited_s < 0.5

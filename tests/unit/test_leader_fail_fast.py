"""A leader cut off from its quorum answers NoQuorum early instead of hanging to its timeout.

Runs on the simulator's virtual-time loop, so "early" is measured in virtual seconds: the test
is deterministic and does not depend on this machine's speed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.errors import NoQuorum
from eventlog.leader import WATCH_STEPS
from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply
from eventlog.node import LogNode
from eventlog.sim.loop import run_on_virtual_time


class BlackHole(MemoryReplica):
    """A replica behind a partition that swallows requests: calls never return."""

    cut = False

    async def append(self, *args: Any) -> AppendReply:
        if self.cut:
            await asyncio.sleep(3600)
        return await super().append(*args)


T = TypeVar("T")


def run(coro_fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    return run_on_virtual_time(coro_fn(*args))


async def cut_off_node(
    *, append_timeout_s: float, replica_call_timeout_s: float, replica_suspect_after_s: float
) -> tuple[LogNode, dict[str, BlackHole]]:
    """Region a leads a one-shard log with conversation c1; then b and c swallow every call."""
    config = LogConfig(
        shard_count=1,
        append_timeout_s=append_timeout_s,
        replica_call_timeout_s=replica_call_timeout_s,
        replica_suspect_after_s=replica_suspect_after_s,
    )
    holes = {"b": BlackHole("b"), "c": BlackHole("c")}
    node = LogNode(
        region="a",
        replicas={"a": MemoryReplica("a"), **holes},
        config=config,
        clock=LoopClock(),
        rng=random.Random(1),
    )
    await node.lead_shard(0)
    await node.create_conversation("t", "c1", "m", {})
    holes["b"].cut = holes["c"].cut = True
    return node, holes


async def cut_off_append(detector_knows: bool) -> float:
    node, _ = await cut_off_node(
        append_timeout_s=30.0, replica_call_timeout_s=10.0, replica_suspect_after_s=1.0
    )
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


async def slow_quorum_append(cancel_one: bool) -> tuple[float, bool]:
    """Two callers wait for one append (the second retries with its Idempotency-Key) while
    both other replicas swallow calls; they are never suspected (suspect time 100 s)."""
    node, holes = await cut_off_node(
        append_timeout_s=3.0, replica_call_timeout_s=1.0, replica_suspect_after_s=100.0
    )
    loop = asyncio.get_running_loop()
    first = loop.create_task(node.append_event("t", "c1", "note", {}, idempotency_key="k"))
    await asyncio.sleep(0.5)
    retry = loop.create_task(node.append_event("t", "c1", "note", {}, idempotency_key="k"))
    started = loop.time()
    await asyncio.sleep(0.5)
    if not cancel_one:
        with pytest.raises(NoQuorum, match=r"within 3\.0s; the outcome is unknown"):
            await retry
        waited_s = loop.time() - started
        assert first.done()
        with pytest.raises(NoQuorum, match=r"within 3\.0s"):
            first.result()
        await node.close()
        return waited_s, False
    first.cancel()
    holes["b"].cut = False
    appended = await retry
    waited_s = loop.time() - started
    await node.close()
    return waited_s, appended.replayed


def test_an_append_without_its_quorum_gives_up_at_its_timeout() -> None:
    waited_s, _ = run(slow_quorum_append, False)
    # virtual seconds: its own deadline, kept to within the watch's step
    assert 3.0 <= waited_s <= 3.0 + LogConfig().quorum_check_s / WATCH_STEPS


def test_a_cancelled_caller_leaves_the_others_waiting_for_the_same_entry() -> None:
    waited_s, replayed = run(slow_quorum_append, True)
    assert replayed  # the retry got the first caller's event once b answered again
    assert waited_s < 3.0

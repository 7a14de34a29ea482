"""A read round asks a quorum first (``eventlog.read_index.QuorumChoice``), the same one for every
shard of a node, and the other replicas only when the chosen ones fail, lag behind the epoch or
are slow. On virtual time (``eventlog.sim.loop``): the replicas' answer times are sleeps, and
"how long a round took" is read off the virtual clock, not measured.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from eventlog.clock import LoopClock
from eventlog.errors import Fenced, ReplicaUnavailable
from eventlog.memory_replica import MemoryReplica
from eventlog.model import ShardStatus
from eventlog.read_index import ASK_ALL_EVERY, QuorumChoice, ReadIndex
from eventlog.sim.loop import run_on_virtual_time

T = TypeVar("T")
TIMEOUT_S = 2.0


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_on_virtual_time(scenario())


async def learned(read_index: ReadIndex) -> None:
    """One round (it asks every replica: no answer time is known yet), and time for the
    slowest answer to come in after the round ended."""
    await read_index.confirm()
    await asyncio.sleep(1.0)


class TimedReplica(MemoryReplica):
    """Status reads that take ``delay_s`` (virtual), fail, or never answer; counted."""

    def __init__(self, region: str, delay_s: float, asked: Counter[str]) -> None:
        super().__init__(region)
        self.delay_s = delay_s
        self.asked = asked
        self.failing = False
        self.hanging = False

    async def status(self, shard: int) -> ShardStatus:
        self.asked[self.region] += 1
        if self.hanging:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.delay_s)
        if self.failing:
            raise ReplicaUnavailable(f"{self.region} down")
        return await super().status(shard)


async def promised(delays: dict[str, float]) -> tuple[dict[str, TimedReplica], Counter[str]]:
    asked: Counter[str] = Counter()
    replicas = {r: TimedReplica(r, d, asked) for r, d in delays.items()}
    for replica in replicas.values():
        for shard in range(4):
            await replica.prepare(shard, 1, 0)
    return replicas, asked


def index(shard: int, replicas: dict[str, TimedReplica], choice: QuorumChoice) -> ReadIndex:
    return ReadIndex(
        shard=shard,
        epoch=1,
        replicas=replicas,
        needed=2,
        timeout_s=TIMEOUT_S,
        on_fenced=lambda promised: None,
        counts=lambda region: True,
        on_status=lambda region, status, asked_at: None,
        clock=LoopClock(),
        choice=choice,
    )


async def timed_confirm(read_index: ReadIndex) -> float:
    """How long (virtual seconds) one confirmation took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await read_index.confirm()
    return loop.time() - started


def test_every_shard_asks_the_two_fastest_replicas_and_the_slowest_only_now_and_then() -> None:
    async def scenario() -> Counter[str]:
        replicas, asked = await promised({"a": 0.001, "b": 0.004, "c": 0.010})
        choice = QuorumChoice()
        indexes = [index(shard, replicas, choice) for shard in range(4)]
        await learned(indexes[0])
        asked.clear()
        for _ in range(50):
            await asyncio.gather(*(i.confirm() for i in indexes))
        return asked

    asked = run(scenario)
    assert asked["a"] == asked["b"] == 200
    # c only in the rounds that ask every replica: one in ASK_ALL_EVERY of the node's rounds
    # (numbered from 1: the learning round was the first)
    assert asked["c"] == sum(1 for n in range(2, 202) if n % ASK_ALL_EVERY == 0) > 0


def test_a_chosen_replica_that_fails_is_replaced_at_once_and_then_left_out() -> None:
    async def scenario() -> tuple[list[float], Counter[str]]:
        replicas, asked = await promised({"a": 0.001, "b": 0.002, "c": 0.010})
        read_index = index(0, replicas, QuorumChoice())
        await learned(read_index)  # a and b are the fastest
        replicas["b"].failing = True
        asked.clear()
        took = [await timed_confirm(read_index) for _ in range(5)]
        return took, asked

    took, asked = run(scenario)
    # the first round after b failed asked c once b's error came: b's 2 ms, then c's 10 ms
    assert took[0] == pytest.approx(0.012)
    assert took[1:] == pytest.approx([0.010] * 4)  # then a and c from the start
    assert asked == {"a": 5, "b": 1, "c": 5}


def test_a_chosen_replica_that_hangs_costs_a_read_the_hedge_not_the_timeout() -> None:
    async def scenario() -> float:
        replicas, _ = await promised({"a": 0.001, "b": 0.002, "c": 0.010})
        read_index = index(0, replicas, QuorumChoice())
        await learned(read_index)
        replicas["b"].hanging = True
        return await timed_confirm(read_index)

    took = run(scenario)
    # asked c after twice b's usual 2 ms (4 ms), then c's own 10 ms; far below TIMEOUT_S
    assert took == pytest.approx(0.004 + 0.010)


def test_a_chosen_replica_behind_the_epoch_does_not_count_and_the_others_are_asked() -> None:
    async def scenario() -> tuple[float, Counter[str]]:
        replicas, asked = await promised({"a": 0.001, "b": 0.002, "c": 0.010})
        read_index = index(0, replicas, QuorumChoice())
        await learned(read_index)
        replicas["b"].wipe()  # b promises nothing now: its answer confirms nothing
        asked.clear()
        return await timed_confirm(read_index), asked

    took, asked = run(scenario)
    assert took == pytest.approx(0.002 + 0.010)
    assert asked == {"a": 1, "b": 1, "c": 1}


def test_a_newer_promise_at_a_chosen_replica_fences_the_leader() -> None:
    async def scenario() -> list[int]:
        replicas, _ = await promised({"a": 0.001, "b": 0.002, "c": 0.010})
        fenced_by: list[int] = []
        read_index = index(0, replicas, QuorumChoice())
        read_index._on_fenced = fenced_by.append
        await learned(read_index)
        await replicas["b"].prepare(0, 2, 0)  # a newer leader's promise at one chosen replica
        with pytest.raises(Fenced):
            await read_index.confirm()
        return fenced_by

    assert run(scenario) == [2]


def test_the_choice_keeps_its_replicas_until_another_is_clearly_faster() -> None:
    choice = QuorumChoice()
    for region, seconds in {"a": 0.010, "b": 0.011, "c": 0.012}.items():
        choice.observe(region, seconds)
    regions = ["a", "b", "c"]

    def first() -> list[str]:
        chosen, _ = choice.first(regions, 2, lambda region: True)
        return sorted(chosen)

    assert first() == ["a", "b"]
    for _ in range(3):
        choice.observe("c", 0.009)  # a little faster than b now: not enough to switch
    assert first() == ["a", "b"]
    for _ in range(20):
        choice.observe("c", 0.002)
    assert first() == ["a", "c"]
    quarantined: Any = lambda region: region != "a"  # noqa: E731 - a replica that may not count
    assert sorted(choice.first(regions, 2, quarantined)[0]) == ["b", "c"]

"""Supervised background loops: a crash restarts the loop with backoff and is visible; expected
failures are outcomes, not crashes (virtual time: ManualClock moves only when slept on)."""

from __future__ import annotations

import asyncio
import itertools
import random

from eventlog.errors import InvariantViolation, NoQuorum
from services.api.metrics import Metrics
from services.supervisor import Supervisor, SupervisorConfig
from tests.unit.clocks import ManualClock


async def test_a_crashing_loop_is_restarted_with_backoff_and_shows_until_it_recovers() -> None:
    clock = ManualClock()
    supervisor = Supervisor(
        clock=clock, rng=random.Random(1), limits=SupervisorConfig(crash_loop_after=3)
    )
    calls: list[float] = []
    crash_until = 5
    seen_unhealthy: list[list[str]] = []
    enough = asyncio.Event()

    async def step() -> None:
        await asyncio.sleep(0)  # the manual clock's sleeps do not yield; this does
        calls.append(clock.now_s)
        seen_unhealthy.append(supervisor.unhealthy())
        if len(calls) >= crash_until + 3:
            enough.set()
        if len(calls) <= crash_until:
            raise InvariantViolation("a record no learner can apply")

    supervisor.start("learn", step, period_s=1.0)
    await enough.wait()
    await supervisor.close()
    gaps = [b - a for a, b in itertools.pairwise(calls[:crash_until])]
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert gaps[-1] > gaps[0]  # the backoff doubles (jittered)
    assert ["learn"] in seen_unhealthy  # crash-looping while it kept crashing
    assert seen_unhealthy[-1] == []  # a clean step clears it
    health = supervisor.loops()[0]
    assert health.crashes == crash_until and "InvariantViolation" in (health.last_error or "")
    assert supervisor.unhealthy() == ["learn"]  # closed: not running any more


async def test_expected_failures_are_not_crashes() -> None:
    clock = ManualClock()
    supervisor = Supervisor(clock=clock, rng=random.Random(1))
    calls = 0
    enough = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        await asyncio.sleep(0)
        calls += 1
        if calls >= 10:
            enough.set()
        raise NoQuorum("two regions unreachable")

    supervisor.start("control", step, period_s=1.0)
    await enough.wait()
    assert supervisor.unhealthy() == []
    assert supervisor.loops()[0].crashes == 0
    await supervisor.close()


async def test_metrics_export_crashes_and_crash_looping() -> None:
    clock = ManualClock()
    supervisor = Supervisor(
        clock=clock, rng=random.Random(1), limits=SupervisorConfig(crash_loop_after=2)
    )
    calls = 0
    enough = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        await asyncio.sleep(0)
        calls += 1
        if calls >= 3:
            enough.set()
        raise RuntimeError("boom")

    supervisor.start("probe", step, period_s=1.0)
    await enough.wait()
    metrics = Metrics("us-east")
    metrics.watch_loops(supervisor)
    text = metrics.render().decode()
    assert 'convplane_background_loop_crash_looping{loop="probe"} 1.0' in text
    assert 'convplane_background_loop_crashes_total{loop="probe"}' in text
    await supervisor.close()

"""``services.control.practice.PracticeRunner``'s blocking conditions on fakes of the drill
driver and the controller: a firing alert, the halt switch, a crash-looping loop, a recent
placement change (the plane's first placement is none), an active drill, preflight."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from eventlog.clock import Clock
from regions.ops_state import Halt
from regions.practice_state import Alert, PracticeState
from services.control.drills.driver import DrillDriver
from services.control.practice import PracticeRunner

QUIET_S = 60.0


class ManualClock(Clock):
    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return int(self.now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class FakePlacement:
    version: int


@dataclass
class FakeSupervisor:
    crash_looping: list[str] = field(default_factory=list)

    def unhealthy(self) -> list[str]:
        return self.crash_looping


@dataclass
class FakeController:
    version: int = 0
    supervisor: FakeSupervisor = field(default_factory=FakeSupervisor)

    def placement(self) -> FakePlacement:
        return FakePlacement(self.version)


@dataclass
class FakeOps:
    halt: Halt = field(default_factory=lambda: Halt(False, "", "", 0))
    active: list[Any] = field(default_factory=list)

    def active_drills(self) -> list[Any]:
        return self.active


@dataclass
class FakePlan:
    failures: tuple[str, ...]


@dataclass
class FakeDriver:
    controller: FakeController = field(default_factory=FakeController)
    ops: FakeOps = field(default_factory=FakeOps)
    preflight_failures: tuple[str, ...] = ()
    leads_control: bool = False

    async def plan(self, spec: Any) -> FakePlan:
        return FakePlan(self.preflight_failures)


def _runner() -> tuple[PracticeRunner, FakeDriver, ManualClock]:
    driver, clock = FakeDriver(), ManualClock()
    runner = PracticeRunner(
        driver=cast(DrillDriver, driver),
        state=PracticeState(),
        clock=clock,
        failover_quiet_s=QUIET_S,
        seed=0,
    )
    return runner, driver, clock


def _blocking(runner: PracticeRunner) -> list[str]:
    return asyncio.run(runner.blocking("evacuate", "eu-west", 5.0))


def test_the_first_placement_is_no_failover_and_a_later_change_blocks_for_the_quiet_time() -> None:
    runner, driver, clock = _runner()
    asyncio.run(runner.step())  # version 0: the static placement, before anything is learned
    driver.controller.version = 1  # the initial committed placement
    asyncio.run(runner.step())
    assert _blocking(runner) == []
    driver.controller.version = 2  # a failover
    asyncio.run(runner.step())
    clock.now_s += QUIET_S - 1
    assert [r for r in _blocking(runner) if r.startswith("placement changed 59 s ago")]
    clock.now_s += 1
    assert _blocking(runner) == []


def test_alerts_halt_crash_looping_loops_active_drills_and_preflight_block() -> None:
    runner, driver, _ = _runner()
    asyncio.run(runner.step())
    driver.preflight_failures = ("survivors lack capacity",)
    assert _blocking(runner) == ["preflight: survivors lack capacity"]
    runner.state.alerts["pager"] = Alert("pager", True, "5xx over budget", "sre", 1)
    runner.state.alerts["old"] = Alert("old", False, "resolved", "sre", 1)
    driver.ops.halt = Halt(True, "incident", "sre", 1)
    driver.controller.supervisor.crash_looping = ["probe"]
    driver.ops.active = [object()]
    assert _blocking(runner) == [
        "alert 'pager' firing: 5xx over budget",
        "halt switch on: incident",
        "background loop 'probe' crash-looping",
        "a drill is active",
    ]  # preflight is asked only when nothing else blocks

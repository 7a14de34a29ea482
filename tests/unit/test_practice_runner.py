"""``services.control.practice.PracticeRunner``'s blocking conditions on fakes of the drill
driver and the controller: a firing alert, the halt switch, a crash-looping loop, a recent
placement change (the plane's first placement is none), an active drill, preflight; and the
error-budget burn on sampled live appends, which blocks a start and aborts a practice drill."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from eventlog.clock import Clock
from regions.error_budget import BurnPolicy
from regions.ops_state import Halt
from regions.practice_state import Alert, CalendarEntry, PracticeState
from services.control.drills.driver import DrillDriver
from services.control.drills.load import PlaneLoad
from services.control.practice import PracticeRunner

QUIET_S = 60.0
BURN = BurnPolicy(slo_availability=0.999, window_s=60.0, rate_max=14.4, min_appends=100)


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
    aborted: list[tuple[str, str, str]] = field(default_factory=list)

    async def plan(self, spec: Any) -> FakePlan:
        return FakePlan(self.preflight_failures)

    async def read_barrier(self) -> None:
        return None

    async def abort(self, drill_id: str, *, by: str, role: str, reason: str) -> None:
        self.aborted.append((drill_id, by, reason))


@dataclass
class FakeSpec:
    region: str


@dataclass
class FakeDrill:
    drill_id: str
    phase: str
    spec: FakeSpec = field(default_factory=lambda: FakeSpec("eu-west"))


@dataclass
class FakeLoad:
    """The plane's live appends answered 2xx and 5xx per second, as ``plane_load`` reads them."""

    succeeded_per_s: float = 100.0
    errors_per_s: float = 0.0

    async def sample(self) -> PlaneLoad:
        return PlaneLoad(0.0, {}, self.succeeded_per_s, self.errors_per_s)


def _runner(load: FakeLoad | None = None) -> tuple[PracticeRunner, FakeDriver, ManualClock]:
    driver, clock = FakeDriver(), ManualClock()
    runner = PracticeRunner(
        driver=cast(DrillDriver, driver),
        state=PracticeState(),
        clock=clock,
        failover_quiet_s=QUIET_S,
        seed=0,
        sample_load=None if load is None else load.sample,
        burn_policy=None if load is None else BURN,
    )
    return runner, driver, clock


def _ticks(runner: PracticeRunner, clock: ManualClock, count: int) -> None:
    for _ in range(count):
        asyncio.run(runner.step())
        clock.now_s += 5.0


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


def test_an_error_budget_burning_over_its_maximum_blocks_a_start_until_it_slows() -> None:
    load = FakeLoad(succeeded_per_s=98.0, errors_per_s=2.0)  # 2 %: 20x a 0.1 % budget
    runner, driver, clock = _runner(load)
    driver.leads_control = True
    _ticks(runner, clock, 6)
    assert _blocking(runner) == []  # the samples span 25 s, under half the window: not judged
    _ticks(runner, clock, 1)
    [reason] = _blocking(runner)
    assert reason.startswith("error budget burning at 20.0x (max 14.4x")
    load.errors_per_s, load.succeeded_per_s = 0.0, 100.0
    _ticks(runner, clock, 13)  # the window (60 s) now holds only clean samples
    assert _blocking(runner) == []


def test_a_new_leader_measures_the_burn_from_its_own_start() -> None:
    load = FakeLoad(succeeded_per_s=0.0, errors_per_s=100.0)
    runner, driver, clock = _runner(load)
    driver.leads_control = True
    _ticks(runner, clock, 7)
    assert _blocking(runner)
    driver.leads_control = False
    _ticks(runner, clock, 1)
    assert _blocking(runner) == []


def test_a_burning_budget_aborts_a_practice_drill_injecting_or_holding() -> None:
    load = FakeLoad(succeeded_per_s=90.0, errors_per_s=10.0)
    runner, driver, clock = _runner(load)
    driver.leads_control = True
    for drill_id in ("d-practice", "d-restoring"):
        runner.state.calendar.append(
            CalendarEntry(1, "weekly", "r1", 1, "ran", "practice run", drill_id)
        )
    driver.ops.active = [
        FakeDrill("d-practice", "holding"),
        FakeDrill("d-restoring", "restoring"),
        FakeDrill("d-by-hand", "holding"),  # an operator's own drill: not the runner's to end
    ]
    _ticks(runner, clock, 6)
    assert driver.aborted == []  # nothing judged before the samples span half the window
    _ticks(runner, clock, 1)
    [(drill_id, by, reason)] = driver.aborted
    assert (drill_id, by) == ("d-practice", "practice")
    assert reason.startswith("outcome alarm: error budget burning at 100.0x")


def test_a_burn_at_the_maximum_neither_blocks_nor_aborts() -> None:
    load = FakeLoad(succeeded_per_s=98.56, errors_per_s=1.44)  # exactly 14.4x
    runner, driver, clock = _runner(load)
    driver.leads_control = True
    runner.state.calendar.append(CalendarEntry(1, "weekly", "r1", 1, "ran", "practice", "d1"))
    driver.ops.active = [FakeDrill("d1", "holding")]
    _ticks(runner, clock, 13)
    assert driver.aborted == []
    driver.ops.active = []
    assert _blocking(runner) == []

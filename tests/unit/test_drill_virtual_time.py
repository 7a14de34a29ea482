"""A whole drill on virtual time: the state machine (regions.drills) driven step by step with the
real canary runner (services.control.drills.canary) against a simulated plane, on the simulator's
virtual-time loop (eventlog.sim.loop): seconds of drill cost no real time, and a run is exact.

The simulated plane: 8 shards, the target ``us-east`` leads shards 1, 4 and 7. From injection
on, writes to those shards fail until ``takeover_s`` (failover done elsewhere), then are served
by ``eu-west``; every other write is acknowledged after ``ack_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from eventlog.clock import LoopClock
from eventlog.errors import Unavailable
from eventlog.sim.loop import run_on_virtual_time as run_virtual
from regions.drills import Drill, DrillSpec, Guards, Observation, advance, start
from services.control.drills.canary import CANARY_TIMEOUT_S, CanaryRunner

SHARDS = 8
MOVED = (1, 4, 7)
OWNERS = {s: ("us-east" if s in MOVED else "ap-south") for s in range(SHARDS)}
TICK_S = 0.2


@dataclass
class SimPlane:
    clock: LoopClock
    takeover_s: float = 1.7
    ack_ms: float = 15.0
    #: shard -> durable canary payload numbers
    durable: dict[str, set[int]] = field(default_factory=dict)
    injected_at_s: float | None = None
    #: the plane loses this many acknowledged events of shard 1 at restore (a broken plane)
    lose_on_restore: int = 0
    #: every write stalls past the canary deadline while this is set
    stalled: bool = False
    #: the target is back (its shards are served by it again)
    restored: bool = False

    async def send(self, owner: str, cid: str, key: str, payload: dict[str, Any]) -> str:
        shard = payload["shard"]
        if self.stalled:
            await self.clock.sleep(CANARY_TIMEOUT_S * 2)
        now_s = self.clock.monotonic()
        region = OWNERS[shard]
        if self.injected_at_s is not None and shard in MOVED and not self.restored:
            if now_s - self.injected_at_s < self.takeover_s:
                raise Unavailable("no quorum: the target is black-holed")
            region = "eu-west"
        await self.clock.sleep(self.ack_ms / 1000)
        self.durable.setdefault(cid, set()).add(payload["n"])
        return region

    async def read(self, owner: str, cid: str, after_seq: int) -> list[dict[str, Any]]:
        return [{"seq": n, "payload": {"n": n}} for n in sorted(self.durable.get(cid, ()))]

    def restore(self) -> None:
        self.restored = True
        for cid in sorted(self.durable):
            if "-s1-" in cid:
                for n in sorted(self.durable[cid])[: self.lose_on_restore]:
                    self.durable[cid].discard(n)


async def run_drill(plane: SimPlane, spec: DrillSpec, *, stall_at_s: float | None = None) -> Drill:
    """The driver's loop in miniature: observe, advance, act; records are just kept."""
    clock = plane.clock
    drill = start("dv", spec, clock.wall_ms())
    drill = replace(drill, measurements=replace(drill.measurements, shards_moved=MOVED))
    runner = CanaryRunner(drill=drill, shard_count=SHARDS, send=plane.send, read=plane.read,
                          clock=clock)  # fmt: skip
    while drill.active:
        if drill.phase == "injecting" and plane.injected_at_s is None:
            plane.injected_at_s = clock.monotonic()
        await runner.round(drill, OWNERS)  # canaries write while restoring, too
        restored, lost = False, None
        if drill.phase == "restoring":
            plane.restore()
            await runner.round(drill, OWNERS)  # the target serves its shards again
            restored, lost = True, await runner.read_back(OWNERS)
        error_ratio, p99 = runner.window()
        obs = Observation(now_ms=clock.wall_ms(), injected=True, injected_at_ms=drill.created_at_ms,
                          shards_moved=MOVED, error_ratio=error_ratio, ack_p99_ms=p99,
                          restored=restored, canary_lost=lost)  # fmt: skip
        measured = replace(drill, measurements=runner.measurements(drill))
        following = advance(measured, obs)
        drill = following or measured
        if stall_at_s is not None and clock.monotonic() >= stall_at_s and drill.phase == "holding":
            plane.stalled = True
        await clock.sleep(TICK_S)
    return drill


def spec(**kw: Any) -> DrillSpec:
    fields: dict[str, Any] = {"kind": "region-loss", "region": "us-east", "hold_s": 10.0,
                              "reason": "virtual"}  # fmt: skip
    fields.update(kw)
    return DrillSpec(**fields)


def test_a_region_loss_drill_passes_with_rto_from_the_first_ack_elsewhere() -> None:
    async def main() -> tuple[Drill, SimPlane]:
        plane = SimPlane(LoopClock())
        return await run_drill(plane, spec()), plane

    drill, plane = run_virtual(main())
    m = drill.measurements
    assert (drill.phase, drill.verdict, m.canary_lost) == ("done", "passed", 0)
    assert sorted(m.rto_s) == list(MOVED)
    # writes to moved shards fail for 1.7 s; the next round after that acks (rounds every
    # 0.2 s of ticks + ~15 ms of acks): RTO within one round of the takeover
    for rto_s in m.rto_s.values():
        assert 1.7 <= rto_s <= 1.7 + TICK_S + 0.1
    # acknowledged numbers are contiguous from 1 per shard, and all durable
    for shard, acked in m.canary_acked.items():
        cid = next(c for c in plane.durable if f"-s{shard}-" in c)
        assert plane.durable[cid] == set(range(1, acked + 1))
    assert m.canary_errors > 0  # the moved shards' failures before the takeover


def test_a_slow_takeover_trips_max_rto_and_the_drill_is_restored_as_aborted() -> None:
    async def main() -> Drill:
        return await run_drill(
            SimPlane(LoopClock(), takeover_s=60.0), spec(guards=Guards(max_rto_s=3.0))
        )

    drill = run_virtual(main())
    assert (drill.phase, drill.verdict) == ("aborted", "aborted")
    assert [g.guard for g in drill.guards_tripped] == ["max_rto_s"]
    holding_ms = next(t[1] for t in drill.timeline if t[0] == "holding")
    restoring_ms = next(t[1] for t in drill.timeline if t[0] == "restoring")
    assert 3000 < restoring_ms - drill.created_at_ms <= 3000 + 2 * 1000 * TICK_S + 200
    assert holding_ms <= restoring_ms


def test_a_stalled_plane_trips_the_error_ratio_guard() -> None:
    async def main() -> Drill:
        return await run_drill(SimPlane(LoopClock()), spec(hold_s=30.0), stall_at_s=5.0)

    drill = run_virtual(main())
    assert drill.verdict == "aborted"
    assert drill.guards_tripped[0].guard == "max_error_ratio"
    assert drill.guards_tripped[0].measured > 0.2


def test_a_lost_acknowledged_canary_fails_the_drill() -> None:
    async def main() -> Drill:
        return await run_drill(SimPlane(LoopClock(), lose_on_restore=2), spec(hold_s=3.0))

    drill = run_virtual(main())
    assert (drill.verdict, drill.measurements.canary_lost) == ("failed", 2)


def test_a_new_driver_continues_the_canary_numbers_from_the_record() -> None:
    async def main() -> tuple[int, set[str]]:
        plane = SimPlane(LoopClock())
        drill = start("dv", spec(), plane.clock.wall_ms())
        first = CanaryRunner(drill=drill, shard_count=SHARDS, send=plane.send, read=plane.read,
                             clock=plane.clock)  # fmt: skip
        for _ in range(3):
            await first.round(drill, OWNERS)
        persisted = replace(drill, measurements=first.measurements(drill))
        second = CanaryRunner(drill=persisted, shard_count=SHARDS, send=plane.send,
                              read=plane.read, clock=plane.clock)  # fmt: skip
        await second.round(persisted, OWNERS)
        return await second.read_back(OWNERS), {str(sorted(v)) for v in plane.durable.values()}

    lost, histories = run_virtual(main())
    assert lost == 0 and histories == {"[1, 2, 3, 4]"}


def test_a_failover_slower_than_the_hold_counts_rto_until_the_target_is_back() -> None:
    async def main() -> Drill:
        plane = SimPlane(LoopClock(), takeover_s=60.0)
        return await run_drill(plane, spec(hold_s=2.0, guards=Guards(max_rto_s=5.0)))

    drill = run_virtual(main())
    assert drill.verdict == "passed", drill.verdict_reason
    assert sorted(drill.measurements.rto_s) == list(MOVED)
    for rto_s in drill.measurements.rto_s.values():
        assert 2.0 <= rto_s <= 2.0 + 3 * TICK_S  # the hold, then the restore's first round

"""Control-shard standoffs in drills (issue 32, bugs 2 and 3), as named scenarios on virtual time.

Five regions of the whole-plane simulator (``services.plane_sim``: real log nodes, controllers
and drill drivers, the drills' black-hole wired as production wires it) on production timings
(``LogConfig`` and ``NodeSettings`` defaults: the control shard's commit push lingers 0.02 s,
a replica is suspected after 1 s, detection takes 1 s). A node that does not lead the control
shard learns its records only from replica commit hints, and chooses the control leader by what
it learned; a leader that acted on a record (or handed the shard over after it) before any
hint covered it left two nodes deferring the shard to each other for good.

* Bug 2: a region-loss drill of the control leader's own region. The leader's fold applied the
  drill record inside the push linger; the black-hole then cut the push off and the drill's
  fence resigned: the target deferred to ``b``, everyone else (knowing no drill) to the target.
* Bug 3: the interim control leader ``b`` commits a drill's end, learns it, and its network
  blips (0.3 to 1.5 s, packets lost; shorter than detection) as it hands control back: ``publish_commit`` saw every
  follower suspected, returned, and ``b`` resigned; ``a`` (drill still active by its hints)
  deferred to ``b``, ``b`` to ``a``.

From shared/repro/turn3 (standoff_fence.py, standoff.py), where the same plane ran on a
hand-built harness.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import cast

import pytest

from eventlog.config import LogConfig
from eventlog.errors import ConvplaneError
from eventlog.sim.loop import run_on_virtual_time
from eventlog.sim.network import NetworkFaults
from regions.drills import Drill, DrillSpec, Phase, start
from regions.ops_state import DRILL_RECORD
from services.control.controller import Controller
from services.plane_sim.plane import SimPlane
from tests.sim.mutations import (
    Mutation,
    commits_wake_no_followers,
    control_fold_applies_unpublished,
    control_handoffs_resign_unpublished,
    control_successors_awaited_forever,
)

SHARDS = 4


def production_plane(seed: int, *, drive_drills: bool, detection_s: float = 1.0) -> SimPlane:
    plane = SimPlane(
        random.Random(seed),
        5,
        SHARDS,
        config=LogConfig(shard_count=SHARDS),
        settings={"detection_s": detection_s},
        drive_drills=drive_drills,
    )
    plane.net.faults = NetworkFaults(delay_min_s=0.001, delay_max_s=0.004)  # one region's AZs
    return plane


def controller(plane: SimPlane, region: str) -> Controller:
    ctl = plane.processes[region].controller
    assert ctl is not None
    return ctl


def views(plane: SimPlane) -> dict[str, str]:
    return {c.region: c.control_leader() for c in plane.controllers()}


async def until(pred: Callable[[], bool], limit_s: float) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while loop.time() < end and not pred():  # noqa: ASYNC110 (a poll of state, virtual time)
        await asyncio.sleep(0.05)
    return pred()


def region_loss_of_a(plane: SimPlane) -> Drill:
    spec = DrillSpec(kind="region-loss", region="a", hold_s=5.0, reason="scenario")
    return start("d1", spec, controller(plane, "a")._clock.wall_ms())


def test_a_region_loss_drill_of_the_control_leader_hands_control_to_a_survivor_and_ends() -> None:
    """Bug 2: the drill record commits at ``a`` (the control leader), ``a``'s fold applies it
    at once (its learn tick lands then, taking ~15 ms) and ``a``'s drill driver steps right
    after, inside the 0.02 s push linger: its fence resigns every shard ``a`` leads before any
    replica's commit hint (``a``'s own included) covers the drill record. Every node must learn the
    drill, ``b`` must lead the control shard and drive the drill to its end, and then ``a``
    leads the control shard again."""

    async def scenario() -> tuple[list[str], dict[str, str], set[str], list[str], str]:
        plane = production_plane(5, drive_drills=True)
        for region in plane.names:
            await plane.start_node(region)
        await asyncio.sleep(10)
        control = plane.cluster.shard_count
        assert plane.leaders_of(control) == ["a"]
        a = controller(plane, "a")
        await a.node.append_record(control, DRILL_RECORD, region_loss_of_a(plane).to_body())
        await a._learn()  # a's learn-reconcile tick lands now
        driver = plane.processes["a"].drills
        assert driver is not None
        await driver.step()  # a's drill driver's step lands now: it fences a
        assert not a.node.leads(control)
        await asyncio.sleep(3)  # the drill holds 5 s
        during = plane.leaders_of(control)
        targets = {r: sorted(p.ops.region_loss_targets()) for r, p in plane.processes.items()
                   if p.ops is not None}  # fmt: skip
        every_node_knows = {r for r, t in targets.items() if t == ["a"]}
        chosen = views(plane)
        ended = await until(
            lambda: all(
                p.ops is not None and not p.ops.active_drills() for p in plane.processes.values()
            ),
            120,
        )
        phases = [p.ops.drills["d1"].phase if "d1" in p.ops.drills else "unknown"
                  for p in plane.processes.values() if p.ops]  # fmt: skip
        assert ended, phases
        await until(lambda: plane.leaders_of(control) == ["a"], 30)
        after = plane.leaders_of(control)[0] if plane.leaders_of(control) else "nobody"
        await plane.close()
        return during, chosen, every_node_knows, phases, after

    during, chosen, every_node_knows, phases, after = run_on_virtual_time(scenario())
    assert during == ["b"], (during, chosen)
    assert set(chosen.values()) == {"b"}, chosen
    assert every_node_knows == set("abcde")
    assert set(phases) == {"done"}, phases
    assert after == "a"


def blip_as_the_interim_leader_hands_control_back(
    blip_s: float,
) -> tuple[list[str], dict[str, str], dict[str, Phase]]:
    """Bug 3's sequence: ``b`` leads the control shard while ``a`` is a drill's target; ``b``
    commits the drill's end, learns it at once, and its network loses every packet for
    ``blip_s`` exactly as its control loop hands the shard back to ``a``. Returns, two virtual
    minutes later, who leads the control shard, whom each node names, and each node's phase of
    the drill."""

    async def scenario() -> tuple[list[str], dict[str, str], dict[str, Phase]]:
        # every blip shorter than detection: nobody declares b down (which would end it)
        plane = production_plane(3, drive_drills=False, detection_s=2.0)
        for region in plane.names:
            await plane.start_node(region)
        await asyncio.sleep(10)
        control = plane.cluster.shard_count
        a = controller(plane, "a")
        drill = region_loss_of_a(plane)
        await a.node.append_record(control, DRILL_RECORD, drill.to_body())
        assert await until(lambda: plane.leaders_of(control) == ["b"], 20), views(plane)
        b = controller(plane, "b")
        for rev, phase in ((2, "holding"), (3, "restoring")):
            drill = dataclasses.replace(drill, rev=rev, phase=cast(Phase, phase))
            await b.node.append_record(control, DRILL_RECORD, drill.to_body())
            await asyncio.sleep(3)
        drill = dataclasses.replace(drill, rev=4, phase="done")
        await b.node.append_record(control, DRILL_RECORD, drill.to_body())
        await b._learn()  # b's driver waits for its fold to apply the record: it lands now
        plane.blip("b", True)
        handoff = asyncio.ensure_future(b._control())  # b's control loop's next step
        await asyncio.sleep(blip_s)
        plane.blip("b", False)
        await handoff
        await asyncio.sleep(120)  # every loop running, no fault
        phases = {r: p.ops.drills["d1"].phase for r, p in plane.processes.items() if p.ops}
        leaders, chosen = plane.leaders_of(control), views(plane)
        await plane.close()
        return leaders, chosen, phases

    return run_on_virtual_time(scenario())


@pytest.mark.parametrize("blip_s", [0.3, 0.6, 0.9, 1.2, 1.5])
def test_a_network_blip_as_the_interim_leader_hands_control_back_ends_in_one_leader(
    blip_s: float,
) -> None:
    """Bug 3: two virtual minutes after the blip exactly one region (``a``) leads the control
    shard, every node names it, and every node knows the drill ended."""
    leaders, chosen, phases = blip_as_the_interim_leader_hands_control_back(blip_s)
    assert leaders == ["a"], chosen
    assert set(chosen.values()) == {"a"}, chosen
    assert set(phases.values()) == {"done"}, phases


#: what publishes a control record before a handoff acts on it (docs/control-shard.md), and
#: the backstop that bounds any standoff they miss
WAKE_OUT, BACKSTOP_OUT = commits_wake_no_followers, control_successors_awaited_forever
RULE_1_OUT, RULE_2_OUT = control_fold_applies_unpublished, control_handoffs_resign_unpublished


@pytest.mark.parametrize(
    ("taken_out", "standoff"),
    [
        ((WAKE_OUT, BACKSTOP_OUT, RULE_2_OUT), False),
        ((WAKE_OUT, BACKSTOP_OUT, RULE_1_OUT), False),
        ((WAKE_OUT, BACKSTOP_OUT, RULE_1_OUT, RULE_2_OUT), True),
    ],
    ids=["rule 1 alone", "rule 2 alone", "bug 3 back"],
)
def test_either_publishing_rule_alone_keeps_the_bug_3_blip_from_a_standoff(
    monkeypatch: pytest.MonkeyPatch, taken_out: tuple[Mutation, ...], standoff: bool
) -> None:
    """Mutations (``tests/sim/mutations.py``): with the commit wake and the succession backstop
    taken out (each masks the others), bug 3's blip ends in one leader while either rule 1 (the
    leader's fold applies only what a quorum's hints hold) or rule 2 (a handoff resigns only
    once its push landed) stands, and in ``a`` and ``b`` naming each other for good with both
    out: the scenario's checks catch bug 3's reintroduction, and each rule alone holds it."""
    for mutation in taken_out:
        mutation(monkeypatch)
    leaders, chosen, _phases = blip_as_the_interim_leader_hands_control_back(0.9)
    if standoff:
        assert leaders == [], chosen
        assert (chosen["a"], chosen["b"]) == ("b", "a"), chosen
    else:
        assert leaders == ["a"], chosen
        assert set(chosen.values()) == {"a"}, chosen


def test_the_demo_drill_of_the_lowest_named_region_stays_readable_and_ends() -> None:
    """Issue 32 item 5: ``convplane demo`` starts a region-loss drill of its last region,
    ap-south, which has the lowest name of the three and so leads the control shard: bug 2's
    setup. When the leader's learn tick and its driver's step land right after the drill record
    commits (inside the 0.02 s push linger), no hint covers the record: ap-south names eu-west,
    eu-west and us-east name ap-south, and every region answers the demo's ``GET`` of the
    drill with 503 ("leader region eu-west unreachable" at ap-south) until the black-hole's
    deadline, past the demo's 30 s watch. Here ``a`` is ap-south, ``b`` eu-west, ``c``
    us-east; the drill is started as ``POST /v1/drills`` starts it (``DrillDriver.create`` at
    the control leader). The drill must stay readable at a control leader (its read barrier
    passes and it knows the drill) within the demo's watch, and end."""

    async def scenario() -> tuple[list[str], bool, list[str]]:
        plane = SimPlane(
            random.Random(7), 3, SHARDS, config=LogConfig(shard_count=SHARDS), settings={}
        )
        plane.net.faults = NetworkFaults(delay_min_s=0.001, delay_max_s=0.004)
        for region in plane.names:
            await plane.start_node(region)
        await asyncio.sleep(10)
        control = plane.cluster.shard_count
        assert plane.leaders_of(control) == ["a"]
        a, driver = controller(plane, "a"), plane.processes["a"].drills
        assert driver is not None
        append_record = a.node.append_record

        async def commit_then_tick(shard: int, record_type: str, body: dict[str, object]) -> int:
            lsn = await append_record(shard, record_type, body)
            if record_type == DRILL_RECORD:
                await a._learn()  # a's learn tick lands now
                await driver.step()  # and its driver's step: the fence
            return lsn

        a.node.append_record = commit_then_tick  # type: ignore[method-assign]
        spec = DrillSpec(kind="region-loss", region="a", hold_s=5.0, reason="demo")
        drill, _ = await driver.create(spec, by="sre", role="operator")
        a.node.append_record = append_record  # type: ignore[method-assign]
        readable = False
        loop = asyncio.get_running_loop()
        watch_until = loop.time() + 30  # the demo's watch
        while loop.time() < watch_until and not readable:
            await asyncio.sleep(0.5)
            for region in plane.leaders_of(control):
                process = plane.processes[region]
                assert process.controller is not None and process.ops is not None
                try:
                    await process.controller.read_barrier()
                except ConvplaneError:
                    continue
                readable = drill.drill_id in process.ops.drills
        await asyncio.sleep(60)
        phases = [p.ops.drills[drill.drill_id].phase if drill.drill_id in p.ops.drills
                  else "unknown" for p in plane.processes.values() if p.ops]  # fmt: skip
        chosen = sorted(set(views(plane).values()))
        await plane.close()
        return chosen, readable, phases

    chosen, readable, phases = run_on_virtual_time(scenario())
    assert readable, chosen
    assert set(phases) == {"done"}, phases
    assert chosen == ["a"]

"""One seeded run of the whole plane: start, load and fault it, heal it, then check it.

Timeline on virtual time: the regions start; clients run while a fault injector acts (network,
databases, nodes, an SRE's evacuations and restores, and drills: region-loss, evacuate and kill,
started at the control leader as ``POST /v1/drills`` starts them, the run killing and restarting
a kill drill's target as ``convplane up``'s supervisor does); then every fault heals (network,
databases, paused and crashed nodes; wiped replicas are rebuilt by the "operator"). After
healing (``services.plane_sim.checks`` states each bound):

* some region leads the control shard and every node names it, within ``CONTROL_LED_BOUND_S``;
* every drill reaches a terminal state by its own deadline plus ``DRILL_END_SLACK_S``;
* the plane becomes live again within ``LIVENESS_BOUND_S``: every node up with no dead or
  crash-looping loop, every node on the same placement, every shard led by the region the
  placement assigns and writable.

One fault may still fire after healing, until every drill has ended: the control leader's
network blip at the commit of a drill's end (shorter than detection, a blip and not an outage),
because a drill mostly ends then and its end is what hands the control shard back.

Throughout the run, no two nodes may defer the control shard to each other for longer than
``STANDOFF_BOUND_S`` (``StandoffWatch``). Then the checker reads every shard's final log.

``nodes_per_region`` above 1 runs regions of several nodes on one database each
(``SimPlane``), with faults on single nodes instead (``_inject_node_faults``: crashes,
restarts, pauses, resumes, network loss and delay; no drills, no database or region faults).
Odd seeds crash nodes only, and never a region's last one: then no shard may ever be placed
on another region (``node_fault_problems``), since a node's death is its region's business.
Even seeds also pause nodes, which keep their slot leases and so fail their region over as a
hung single node does. Liveness after healing also wants each node slot held by exactly one
node, its own node once all of the region's nodes run (``regions_led_once``).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from eventlog.conversations import AppendedEvent
from eventlog.errors import ConvplaneError, InvariantViolation
from eventlog.model import LogEntry
from eventlog.sim.loop import VirtualTimeLoop
from eventlog.sim.network import NetworkFaults
from regions.control import OperatorAction
from regions.drill_kinds import rules_of
from regions.drills import KINDS, TERMINAL, Drill, DrillSpec, deadline_s
from regions.ops_state import DRILL_RECORD
from services.control.drills.local_kill import FAULT_PHASES
from services.plane_sim.checks import (
    StandoffWatch,
    check_plane,
    control_problems,
    drill_problems,
    failback_moves_problem,
    node_fault_problems,
    regions_led_once,
)
from services.plane_sim.plane import SimPlane
from services.plane_sim.workload import Client, Observed

#: virtual seconds the plane gets, after every fault healed, to be fully live again: detection
#: (1 s) + failover leads + the failback hysteresis (4 s) and its steps, with room to spare
LIVENESS_BOUND_S = 30.0
#: the plane must stay live (same placement, every shard writable) this long to count as live
STABLE_S = 2.0
#: version of the simulation: a seed replays exactly only on the same version; regression
#: seeds are pinned to it (tests/sim/test_plane_simulation.py)
#: 3: the log keys conversations by (tenant, id) and loads them in pages; 4: a shard leader's
#: waiting appends share one timer (ShardLeader._watch_waiters), not one each; 5: a control
#: leader that hands the shard over publishes its commit position first (publish_commit), a
#: read-index round's done callback fails its waiters, and the control fold's read has a
#: deadline (LEARN_READ_DEADLINE_S)
#: 6: drills (region-loss, evacuate, kill) run in every seed, with the drills' black-hole wired
#: as production wires it; control handoffs publish at a write quorum and a node passes over a
#: control successor that does not lead (regions.control_succession)
#: 7: the control leader's network blips the moment it commits a region-loss drill's first
#: record or its end (CONTROL_COMMIT_BLIP_P), drawn from an rng of its own: a seed where that
#: blip never fires replays as on version 6
PLANE_SIM_VERSION = 7
#: after healing, some region leads the control shard and every node names it within this:
#: detection (1 s) + two successors passed over (control_handoff_wait_s, 3 s each) + leads
CONTROL_LED_BOUND_S = 12.0
#: a drill ends (done, aborted or failed) at its deadline (hold + restore grace) at the latest;
#: after healing, this much more for a control leader to be found and to commit the end
DRILL_END_SLACK_S = 15.0
#: no two nodes name each other as the control leader, neither leading it, for longer than
#: this: a node passes over a successor that does not lead after control_handoff_wait_s (3 s)
STANDOFF_BOUND_S = 9.0
#: how often the standoff watch and the control check look
WATCH_EVERY_S = 0.25
#: an SRE starts a drill after a pause drawn from this range (seconds)
DRILL_EVERY_S = (0.3, 2.0)
#: how often the SRE's turn is a blip of the control leader's network instead, and how long
CONTROL_BLIP_P = 0.3
CONTROL_BLIPS_S = (0.3, 0.6, 0.9, 1.5)
#: half of those blips wait (up to this long, looking this often) for the control leader to
#: apply a drill's end, and blip it then: as it hands the control shard back
BLIP_WAIT_S = 5.0
BLIP_LOOK_EVERY_S = 0.05
#: how often the control leader's network blips the moment it commits a region-loss drill's
#: first record or its end (the records that change who should lead the control shard), and
#: how long: shorter than detection (1 s), so nobody declares it down; drawn from an rng of
#: its own, so a seed where it never fires runs as on version 6
CONTROL_COMMIT_BLIP_P = 0.5
CONTROL_COMMIT_BLIPS_S = (0.3, 0.6, 0.9)
#: drill holds the injector picks from
DRILL_HOLDS_S = (1.0, 2.0, 4.0)


@dataclass
class PlaneResult:
    seed: int
    regions: int
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    sim_time_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def run_plane_seed(
    seed: int, *, regions: int = 3, clients: int = 3, ops: int = 25, nodes_per_region: int = 1
) -> PlaneResult:
    loop = VirtualTimeLoop()
    try:
        run = _PlaneRun(seed, regions, clients, ops, nodes_per_region)
        return loop.run_until_complete(run.run())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


class _PlaneRun:
    def __init__(
        self, seed: int, regions: int, clients: int, ops: int, nodes_per_region: int = 1
    ) -> None:
        self.rng = random.Random(seed)
        self.result = PlaneResult(seed, regions)
        self.plane = SimPlane(
            random.Random(self.rng.getrandbits(64)),
            regions,
            shard_count=4,
            nodes_per_region=nodes_per_region,
        )
        #: regions of several nodes: faults hit single nodes (``_inject_node_faults``)
        self.node_faults = nodes_per_region > 1
        #: with node faults, odd seeds crash nodes only: no shard may leave its region
        self.crashes_only = self.node_faults and seed % 2 == 1
        self.shards_left_region = False  # node_fault_problems said so once (not every look)
        self.observed = Observed()
        self.clients = [
            Client(self.plane, self.observed, random.Random(self.rng.getrandbits(64)), f"u{i}")
            for i in range(clients)
        ]
        self.ops = ops
        self.workload_done = False
        self.crashed_nodes: set[str] = set()
        #: kill drill id -> the region the run killed for it and has not restarted yet
        self.drill_killed: dict[str, str] = {}
        self.blipped: set[str] = set()
        self.commit_blip_rng = random.Random(f"{seed}/control-commit-blips")
        self.commit_blips: list[asyncio.Task[None]] = []
        self.drills_ended = False
        self.plane.commit_watchers.append(self._blip_at_control_commit)
        self.drill_kills_done: set[str] = set()
        self.standoffs = StandoffWatch(STANDOFF_BOUND_S, self.plane.cluster.shard_count)

    async def run(self) -> PlaneResult:
        plane = self.plane
        try:
            for target in plane.targets:
                await plane.start_node(target)
            await asyncio.sleep(3.0)  # the regions find each other and lead their shards
            watch = asyncio.ensure_future(self._watch())
            injector = asyncio.ensure_future(self._inject_faults())
            drills = asyncio.ensure_future(self._start_drills())
            await asyncio.gather(*(c.run(self.ops) for c in self.clients))
            self.workload_done = True
            await asyncio.gather(injector, drills)
            healed_at = await self._heal()
            await self._await_control_leader(healed_at)
            await self._await_drills_end()
            self.drills_ended = True
            await asyncio.gather(*self.commit_blips)
            version_at_heal = max(c.state.version for c in plane.controllers())
            await self._await_liveness(asyncio.get_running_loop().time())
            watch.cancel()
            self.result.violations += self.standoffs.violations
            final_version = max(c.state.version for c in plane.controllers())
            self.result.counts["placement_changes"] = final_version
            settings = plane.settings(plane.names[0])
            self.result.violations += failback_moves_problem(
                version_at_heal,
                final_version,
                plane.cluster.shard_count,
                settings.failback_shards_per_step,
                len(plane.names),
            )
            self.result.violations += await check_plane(plane, self.observed)
        except InvariantViolation as exc:
            self.result.violations.append(f"invariant violation: {exc}")
        self.result.violations += plane.history.violations
        self.result.counts.update(plane.counts)
        self.result.sim_time_s = asyncio.get_running_loop().time()
        await plane.close()
        return self.result

    # --- faults ---------------------------------------------------------------------------

    async def _inject_faults(self) -> None:
        if self.node_faults:
            await self._inject_node_faults()
            return
        rng = random.Random(self.rng.getrandbits(64))
        plane, net = self.plane, self.plane.net
        names = plane.names
        minority = (len(names) - 1) // 2  # at most this many regions faulted at once
        while not self.workload_done:
            await asyncio.sleep(rng.uniform(0.1, 0.8))
            region = rng.choice(names)
            faulted = self._faulted()
            choice = rng.random()
            if choice < 0.10 and len(faulted | {region}) <= minority:
                net.partition(region)
                self._fault("partition")
            elif choice < 0.16 and len(faulted | {region}) <= minority:
                net.cut.add((region, rng.choice([r for r in names if r != region])))
                self._fault("one_way_loss")
            elif choice < 0.26:
                net.heal()
                self._fault("heal_network")
            elif choice < 0.32 and len(faulted | {region}) <= minority:
                net.crashed.add(region)
                self._fault("database_crash")
            elif choice < 0.38:
                net.crashed.clear()
                net.stalled_s.clear()
                self._fault("database_recover")
            elif choice < 0.43 and len(faulted | {region}) <= minority:
                net.stalled_s[region] = rng.choice([0.2, 0.6, 1.5])
                self._fault("database_stall")
            elif choice < 0.50 and len(faulted | {region}) <= minority:
                await plane.stop_node(region)
                self.crashed_nodes.add(region)
                self._fault("node_crash")
            elif choice < 0.58 and self.crashed_nodes:
                await self._restart_a_crashed_node(rng)
            elif choice < 0.63 and len(faulted | {region}) <= minority:
                if plane.processes[region].node is not None:
                    plane.pause_node(region, True)
                    self._fault("node_pause")
            elif choice < 0.68:
                plane.resume_all()
                self._fault("node_resume")
            elif choice < 0.70 and not plane.wiped and len(faulted | {region}) <= minority:
                plane.wipe_replica(region)
                self._fault("replica_disk_loss")
            elif choice < 0.80:
                net.faults = _network_faults(rng)
                self._fault("loss_delay_duplication")
            else:
                await self._operator(rng)

    async def _inject_node_faults(self) -> None:
        """Faults on single nodes of regions of several nodes (module docstring)."""
        rng = random.Random(self.rng.getrandbits(64))
        plane, net = self.plane, self.plane.net
        while not self.workload_done:
            await asyncio.sleep(rng.uniform(0.1, 0.8))
            running = [t for t in plane.targets if plane.processes[t].node is not None]
            choice = rng.random()
            if choice < 0.35:
                # never a region's last running node: then its region is lost, not a node
                spare = [t for t in running if self._siblings_running(t) > 0]
                if spare:
                    target = rng.choice(spare)
                    await plane.stop_node(target)
                    self.crashed_nodes.add(target)
                    self._fault("node_crash")
            elif choice < 0.60 and self.crashed_nodes:
                await self._restart_a_crashed_node(rng)
            elif choice < 0.72 and not self.crashes_only:
                paused_regions = {p.region for p in plane.processes.values() if p.paused}
                if not paused_regions:  # one region's nodes at a time (a minority)
                    target = rng.choice(running)
                    plane.pause_node(target, True)
                    self._fault("node_pause")
            elif choice < 0.84:
                plane.resume_all()
                self._fault("node_resume")
            else:
                net.faults = _network_faults(rng)
                self._fault("loss_delay_duplication")

    async def _restart_a_crashed_node(self, rng: random.Random) -> None:
        back = rng.choice(sorted(self.crashed_nodes))
        self.crashed_nodes.discard(back)
        await self.plane.start_node(back)
        self._fault("node_restart")

    def _siblings_running(self, target: str) -> int:
        region = self.plane.processes[target].region
        return sum(
            1
            for p in self.plane.processes.values()
            if p.region == region and p.name != target and p.node is not None
        )

    def _faulted(self) -> set[str]:
        plane, net = self.plane, self.plane.net
        cut = {src for src, _ in net.cut} | {dst for _, dst in net.cut}
        paused = {p.name for p in plane.processes.values() if p.paused}
        drilled = {d.spec.region for d in self._active_drills()}
        return (
            cut
            | set(net.crashed)
            | set(net.stalled_s)
            | self.crashed_nodes
            | paused
            | plane.wiped
            | drilled
            | set(self.drill_killed.values())
            | self.blipped
        )

    def _active_drills(self) -> list[Drill]:
        return [d for d in self._drills_seen() if d.active]

    async def _start_drills(self) -> None:
        """An SRE starts a drill every few seconds while the workload runs; now and then the
        control leader's network blips instead (shorter than detection, or a little longer),
        which catches it committing, learning and handing over drill records. (Not with node
        faults: those runs have no drills.)"""
        if self.node_faults:
            return
        rng = random.Random(self.rng.getrandbits(64))
        blips: list[asyncio.Task[None]] = []
        while not self.workload_done:
            await asyncio.sleep(rng.uniform(*DRILL_EVERY_S))
            if rng.random() < CONTROL_BLIP_P:
                at_drill_end = rng.random() < 0.5
                region = await (self._drill_end_leader() if at_drill_end else self._leader())
                if region is not None and region not in self._faulted():
                    blips.append(asyncio.ensure_future(self._blip(region, rng)))
                continue
            await self._drill(rng, self._faulted())
        await asyncio.gather(*blips)

    async def _leader(self) -> str | None:
        leaders = self.plane.leaders_of(self.plane.cluster.shard_count)
        return leaders[0] if leaders else None

    async def _drill_end_leader(self) -> str | None:
        """The control leader whose fold has just applied a drill's end (it is about to hand
        the control shard back to the drill's target), watched for up to ``BLIP_WAIT_S``."""
        ended = {d.drill_id for d in self._drills_seen() if not d.active}
        loop = asyncio.get_running_loop()
        until = loop.time() + BLIP_WAIT_S
        while loop.time() < until and not self.workload_done:
            await asyncio.sleep(BLIP_LOOK_EVERY_S)
            for process in self.plane.serving():
                node, ops = process.node, process.ops
                if node is None or ops is None or not node.leads(self.plane.cluster.shard_count):
                    continue
                if {d.drill_id for d in ops.drills.values() if not d.active} - ended:
                    return process.name
        return None

    async def _blip(self, region: str, rng: random.Random) -> None:
        """``region``'s node loses every packet for a moment (its process runs on)."""
        self._blip_starts(region, "control_leader_blip")
        await self._blip_ends(region, rng.choice(CONTROL_BLIPS_S))

    def _blip_at_control_commit(self, region: str, shard: int, entries: Sequence[LogEntry]) -> None:
        """A ``SimPlane.commit_watchers`` hook: now and then, the control leader's network
        blips the moment it commits a record that changes who should lead the control shard,
        before any follower has pushed the commit. Only the leader knows the record is
        committed (the replicas hold it, their commit hints do not), and it may hand the
        control shard over on it; a handoff that does not wait for its push to land leaves the
        successor deferring back to it (issue 32, bug 3)."""
        if shard != self.plane.cluster.shard_count or self.drills_ended:
            return
        if not any(_moves_control(entry) for entry in entries):
            return
        rng = self.commit_blip_rng
        if rng.random() >= CONTROL_COMMIT_BLIP_P or region in self._faulted():
            return
        self._blip_starts(region, "control_commit_blip")
        duration_s = rng.choice(CONTROL_COMMIT_BLIPS_S)
        self.commit_blips.append(asyncio.ensure_future(self._blip_ends(region, duration_s)))

    def _blip_starts(self, region: str, kind: str) -> None:
        self.blipped.add(region)
        self.plane.blip(region, True)
        self._fault(kind)

    async def _blip_ends(self, region: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        self.plane.blip(region, False)
        self.blipped.discard(region)

    async def _drill(self, rng: random.Random, faulted: set[str]) -> None:
        """A drill (``POST /v1/drills``) at whichever node leads control; half of them target
        the control leader's own region (its fence and the control handoffs)."""
        for process in self.plane.serving():
            controller, drills = process.controller, process.drills
            if controller is None or drills is None:
                continue
            if controller.node.leads(controller.control_shard):
                region = process.name if rng.random() < 0.5 else rng.choice(self.plane.names)
                if region in faulted:
                    return
                spec = DrillSpec(
                    kind=rng.choice(KINDS),
                    region=region,
                    hold_s=rng.choice(DRILL_HOLDS_S),
                    reason="simulated drill",
                    force=True,
                )
                try:
                    await asyncio.wait_for(drills.create(spec, by="sre", role="operator"), 5.0)
                    self._fault(f"drill_{spec.kind}")
                except (ConvplaneError, TimeoutError, httpx.HTTPError):
                    self._fault("drill_refused")
                return

    async def _kill_drills(self) -> None:
        """What ``convplane up``'s supervisor does for kill drills (``services.control.drills.local_kill``):
        a kill drill injecting or holding gets its target's node killed once; once the drill has
        moved on, the node starts again."""
        for drill in self._drills_seen():
            drill_id, region = drill.drill_id, drill.spec.region
            if rules_of(drill.spec.kind).fault != "process":
                continue
            if drill.phase in FAULT_PHASES:
                if drill_id not in self.drill_killed and drill_id not in self.drill_kills_done:
                    if self.plane.processes[region].node is not None:
                        await self.plane.stop_node(region)
                        self.crashed_nodes.discard(region)
                    self.drill_killed[drill_id] = region
            elif drill_id in self.drill_killed:
                back = self.drill_killed.pop(drill_id)
                self.drill_kills_done.add(drill_id)
                if self.plane.processes[back].node is None and back not in self.crashed_nodes:
                    await self.plane.start_node(back)

    def _drills_seen(self) -> list[Drill]:
        """The newest revision of every drill, over every node's fold."""
        found: dict[str, Drill] = {}
        for process in self.plane.processes.values():
            for drill in process.ops.drills.values() if process.ops is not None else ():
                known = found.get(drill.drill_id)
                if known is None or drill.rev > known.rev:
                    found[drill.drill_id] = drill
        return list(found.values())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._kill_drills()
            self.standoffs.look(loop.time(), self.plane)
            if self.crashes_only and not self.shards_left_region:
                moved = node_fault_problems(self.plane, loop.time())
                self.shards_left_region = bool(moved)
                self.result.violations += moved[:3]
            await asyncio.sleep(WATCH_EVERY_S)

    async def _operator(self, rng: random.Random) -> None:
        """An SRE evacuates a region, or restores one, at whichever node leads control."""
        actions: list[OperatorAction] = ["evacuate", "restore"]
        action = rng.choice(actions)
        region = rng.choice(self.plane.names)
        for controller in self.plane.controllers():
            if controller.node.leads(controller.control_shard):
                try:
                    await asyncio.wait_for(controller.operator(action, region), 2.0)
                    self._fault(action)
                except (ConvplaneError, TimeoutError):
                    pass
                return

    def _fault(self, kind: str) -> None:
        self.result.faults[kind] += 1

    # --- the end --------------------------------------------------------------------------

    async def _heal(self) -> float:
        plane, net = self.plane, self.plane.net
        net.heal()
        net.crashed.clear()
        net.stalled_s.clear()
        net.faults = NetworkFaults()
        plane.resume_all()
        for region in sorted(self.crashed_nodes):
            await plane.start_node(region)
        self.crashed_nodes.clear()
        for region in sorted(plane.wiped):
            for _attempt in range(10):
                try:
                    await plane.rebuild_replica(region)
                    break
                except ConvplaneError:
                    await asyncio.sleep(0.5)
        return asyncio.get_running_loop().time()

    async def _await_control_leader(self, healed_at: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            problems = control_problems(self.plane)
            if not problems:
                self.result.counts["control_led_in_ms"] = int((loop.time() - healed_at) * 1000)
                return
            if loop.time() - healed_at >= CONTROL_LED_BOUND_S:
                self.result.violations += [
                    f"control shard not led {CONTROL_LED_BOUND_S:.0f}s after healing: {p}"
                    for p in problems[:3]
                ]
                return
            await asyncio.sleep(WATCH_EVERY_S)

    async def _await_drills_end(self) -> None:
        """Every drill ends by its own deadline (from its creation) plus ``DRILL_END_SLACK_S``."""
        loop = asyncio.get_running_loop()
        active = self._active_drills()
        if not active:
            return
        bound_s = max(deadline_s(d.spec) for d in active) + DRILL_END_SLACK_S
        until = loop.time() + bound_s
        while loop.time() < until:
            await asyncio.sleep(WATCH_EVERY_S)
            if not drill_problems(self.plane):
                self.result.counts["drills_ended"] += len(active)
                return
        self.result.violations += [
            f"drill not ended {bound_s:.0f}s after healing: {p}"
            for p in drill_problems(self.plane)[:3]
        ]

    async def _await_liveness(self, healed_at: float) -> None:
        """Live = no problem at two checks ``STABLE_S`` apart on the same placement version
        (a placement still stepping towards its target is not converged yet)."""
        loop = asyncio.get_running_loop()
        problems: list[str] = []
        live_since: tuple[float, int] | None = None
        while loop.time() - healed_at < LIVENESS_BOUND_S:
            await self._lift_evacuations()
            problems = await self._liveness_problems()
            version = max(c.state.version for c in self.plane.controllers())
            if problems:
                live_since = None
            elif live_since is None or live_since[1] != version:
                live_since = (loop.time(), version)
            elif loop.time() - live_since[0] >= STABLE_S:
                self.result.counts["recovered_in_ms"] = int((live_since[0] - healed_at) * 1000)
                return
            await asyncio.sleep(0.5)
        self.result.violations += [
            f"not live {LIVENESS_BOUND_S:.0f}s after healing: {p}" for p in problems[:5]
        ]

    async def _lift_evacuations(self) -> None:
        """The SRE restores every evacuated region (at the control leader; tried again at the
        next check when there is none yet)."""
        for controller in self.plane.controllers():
            if not controller.node.leads(controller.control_shard):
                continue
            for region in sorted(controller.placement().evacuated):
                try:
                    await asyncio.wait_for(controller.operator("restore", region), 2.0)
                except (ConvplaneError, TimeoutError):
                    pass

    async def _liveness_problems(self) -> list[str]:
        plane = self.plane
        problems = regions_led_once(plane)
        versions = {c.region: c.state.version for c in plane.controllers()}
        if len(set(versions.values())) > 1:
            problems.append(f"placement not converged: {versions}")
        for controller in plane.controllers():
            if controller.supervisor.unhealthy():
                problems.append(f"{controller.region}: loops {controller.supervisor.unhealthy()}")
            if controller.placement().evacuated or controller.placement().down:
                problems.append(f"{controller.region}: placement still {controller.placement()}")
            quarantined = sorted(controller.node.identity.quarantined())
            if quarantined:
                problems.append(f"{controller.region}: replicas quarantined {quarantined}")
        if problems:
            return problems
        placement = plane.controllers()[0].placement()
        for shard, owner in sorted(placement.assignment.items()):
            if plane.leaders_of(shard) != [owner]:
                problems.append(f"shard {shard}: led by {plane.leaders_of(shard)}, not {owner}")
                continue
            node = plane.node(owner, shard)
            assert node is not None
            probe = f"probe-{shard}"
            while node.shard_of(probe) != shard:
                probe += "x"
            try:
                await node.create_conversation("liveness", probe, "m@1", {})
                written = await node.append_event("liveness", probe, "note", {"live": True})
            except ConvplaneError as exc:
                problems.append(f"shard {shard}: not writable at {owner}: {exc}")
                continue
            assert isinstance(written, AppendedEvent)
        return problems


def _network_faults(rng: random.Random) -> NetworkFaults:
    """Loss, delay and duplication, drawn from ``rng``."""
    return NetworkFaults(
        delay_min_s=0.001,
        delay_max_s=rng.choice([0.005, 0.03, 0.1]),
        drop_p=rng.choice([0.0, 0.02, 0.08]),
        duplicate_p=rng.choice([0.0, 0.05, 0.2]),
    )


def _moves_control(entry: LogEntry) -> bool:
    """A region-loss drill's first record or its end: the record that excludes its target from
    leading the control shard, or lets it lead again (``OpsState.region_loss_targets``)."""
    if entry.event_type != DRILL_RECORD:
        return False
    drill = Drill.from_body(json.loads(entry.body))
    return rules_of(drill.spec.kind).fault == "black_hole" and (
        drill.rev == 1 or drill.phase in TERMINAL
    )

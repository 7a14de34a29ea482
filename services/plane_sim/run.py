"""One seeded run of the whole plane: start, load and fault it, heal it, then check it.

Timeline on virtual time: the regions start; clients run while a fault injector acts; then every
fault heals (network, databases, paused and crashed nodes; wiped replicas are rebuilt by the
"operator"), and the plane must become live again within ``LIVENESS_BOUND_S``: every node up
with no dead or crash-looping loop, every node on the same placement, every shard led by the
region the placement assigns and writable. Then the checker reads every shard's final log.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

from eventlog.conversations import AppendedEvent
from eventlog.errors import ConvplaneError, InvariantViolation
from eventlog.sim.loop import VirtualTimeLoop
from eventlog.sim.network import NetworkFaults
from regions.control import OperatorAction
from services.plane_sim.checks import check_plane, failback_moves_problem
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
PLANE_SIM_VERSION = 5


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


def run_plane_seed(seed: int, *, regions: int = 3, clients: int = 3, ops: int = 25) -> PlaneResult:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(_PlaneRun(seed, regions, clients, ops).run())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


class _PlaneRun:
    def __init__(self, seed: int, regions: int, clients: int, ops: int) -> None:
        self.rng = random.Random(seed)
        self.result = PlaneResult(seed, regions)
        self.plane = SimPlane(random.Random(self.rng.getrandbits(64)), regions, shard_count=4)
        self.observed = Observed()
        self.clients = [
            Client(self.plane, self.observed, random.Random(self.rng.getrandbits(64)), f"u{i}")
            for i in range(clients)
        ]
        self.ops = ops
        self.workload_done = False
        self.crashed_nodes: set[str] = set()

    async def run(self) -> PlaneResult:
        plane = self.plane
        try:
            for region in plane.names:
                await plane.start_node(region)
            await asyncio.sleep(3.0)  # the regions find each other and lead their shards
            injector = asyncio.ensure_future(self._inject_faults())
            await asyncio.gather(*(c.run(self.ops) for c in self.clients))
            self.workload_done = True
            await injector
            healed_at = await self._heal()
            version_at_heal = max(c.state.version for c in plane.controllers())
            await self._await_liveness(healed_at)
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
                back = rng.choice(sorted(self.crashed_nodes))
                self.crashed_nodes.discard(back)
                await plane.start_node(back)
                self._fault("node_restart")
            elif choice < 0.63 and len(faulted | {region}) <= minority:
                if plane.processes[region].node is not None:
                    plane.pause_node(region, True)
                    self._fault("node_pause")
            elif choice < 0.68:
                for process in plane.processes.values():
                    if process.paused:
                        plane.pause_node(process.name, False)
                self._fault("node_resume")
            elif choice < 0.70 and not plane.wiped and len(faulted | {region}) <= minority:
                plane.wipe_replica(region)
                self._fault("replica_disk_loss")
            elif choice < 0.80:
                net.faults = NetworkFaults(
                    delay_min_s=0.001,
                    delay_max_s=rng.choice([0.005, 0.03, 0.1]),
                    drop_p=rng.choice([0.0, 0.02, 0.08]),
                    duplicate_p=rng.choice([0.0, 0.05, 0.2]),
                )
                self._fault("loss_delay_duplication")
            else:
                await self._operator(rng)

    def _faulted(self) -> set[str]:
        plane, net = self.plane, self.plane.net
        cut = {src for src, _ in net.cut} | {dst for _, dst in net.cut}
        paused = {p.name for p in plane.processes.values() if p.paused}
        return (
            cut | set(net.crashed) | set(net.stalled_s) | self.crashed_nodes | paused | plane.wiped
        )

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
        for process in plane.processes.values():
            if process.paused:
                plane.pause_node(process.name, False)
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
        problems = []
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
            node = plane.node(owner)
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

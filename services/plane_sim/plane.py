"""The simulated plane: every region's real ``LogNode`` and real ``Controller`` on virtual time.

Each region has an in-memory replica, a log node, a controller running its supervised loops
(probe, learn + reconcile, control, verify replicas) and a drill driver (``services.control.drills.driver``,
with the drills' black-hole around its replica ports, its probes and its peer calls), wired as
``services.bootstrap`` wires them but with the simulated network behind the replica ports, the
``PeerProber`` port and the drill driver's peer HTTP transport (``services.plane_sim.peers``).
What the simulation can do to a region (each counted as a fault by kind in ``PlaneRun.faults``):

* ``crash_node`` / ``restart_node``: the node process dies (its memory is gone) and later a new
  one starts with a fresh controller and log node;
* ``pause_node`` / ``resume_node``: the node stops answering and sending (a GC pause, a stopped
  VM) and later wakes up with its old memory, leaders and all;
* ``blip``: the node's network loses every packet for a moment while its process runs on
  (``commit_watchers`` let the run aim one at a leader right after a commit, before any
  follower has pushed it);
* ``wipe_replica``: the region's database comes back empty (disk loss, re-provisioning);
  ``rebuild_replica`` is the operator's ``convplane replica rebuild``.

With ``nodes_per_region`` above 1 each region runs that many nodes on its one database, each a
process of its own (named by ``services.control.region_nodes.node_target``: ``a``, ``a/1``,
...) with a lease per node slot of the region (``SimLease``: a crashed process's leases come
free, a paused one keeps them, as a database session does); crashes and pauses then hit one
node.

Nothing here decides anything the product decides: it only runs the product's code.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.model import LogEntry
from eventlog.node import LogNode
from eventlog.rebuild import rebuild_replica
from eventlog.sim.checker import History
from eventlog.sim.network import SimNetwork
from eventlog.sim.witnessed_replica import WitnessedReplica
from regions.ops_state import OpsState
from services.bootstrap.node import build_controller
from services.config import ClusterConfig, NodeAddress, NodeSettings, RegionConfig
from services.control.controller import Controller
from services.control.drills.driver import DrillDriver
from services.control.drills.faults import (
    BlackHole,
    BlackHoleTransport,
    black_holed_replicas,
    region_by_address,
)
from services.control.drills.load import LoadMeter
from services.control.region_nodes import fixed_peer_urls, node_target, target_region
from services.plane_sim.network import SimProber
from services.plane_sim.peers import SimPeerTransport

REGION_NAMES = "abcde"

#: told of every commit of every leader, as it commits (before any follower pushes it):
#: the committing region, the shard and the newly committed entries
CommitWatcher = Callable[[str, int, Sequence[LogEntry]], None]


class SkewedClock(LoopClock):
    """The loop's time, with this node's wall clock off by ``skew_ms`` (clock skew)."""

    def __init__(self, skew_ms: int) -> None:
        super().__init__()
        self.skew_ms = skew_ms

    def wall_ms(self) -> int:
        return super().wall_ms() + self.skew_ms


class SimRegionLock:
    """What a region's database is to its nodes' leases of one node slot: one holder at a
    time."""

    def __init__(self) -> None:
        self.holder: SimLease | None = None


class SimLease:
    """A node's ``RegionLease`` of one node slot on the simulated region database
    (``SimRegionLock``)."""

    reachable = True  # a node that runs reaches its region's simulated database

    def __init__(self, lock: SimRegionLock) -> None:
        self._lock = lock

    async def try_acquire(self) -> bool:
        if self._lock.holder is None:
            self._lock.holder = self
        return self._lock.holder is self

    async def still_held(self) -> bool:
        return self._lock.holder is self

    async def release(self) -> None:
        if self._lock.holder is self:
            self._lock.holder = None

    async def close(self) -> None:
        await self.release()


@dataclass
class RegionProcess:
    """One region's node process as the simulation sees it (``name``: its node target)."""

    name: str
    leases: list[SimLease] = field(default_factory=list)
    node: LogNode | None = None
    controller: Controller | None = None
    paused: bool = False
    ops: OpsState | None = None
    drills: DrillDriver | None = None
    peers: httpx.AsyncClient | None = None

    @property
    def serving(self) -> bool:
        return self.node is not None and not self.paused

    @property
    def region(self) -> str:
        return target_region(self.name)


class _LeaderChanges:
    """A ``LogListener`` that counts shard leaderships taken, for the run's report."""

    def __init__(self, counter: Counter[str]) -> None:
        self._counter = counter

    def shard_led(self, shard: int, epoch: int, previous_region: str | None) -> None:
        self._counter["leader_changes"] += 1

    def conversation_written(self, tenant_id: str, conversation_id: str, event_type: str) -> None:
        return None


#: the control shard's commit push linger, one drawn per seed
RECORDS_PUSH_DELAYS_S = (0.01, 0.05, 0.25)
#: the simulator's node settings: short timings, so a seed covers many faults in little time
SIM_SETTINGS: Mapping[str, Any] = {
    "probe_interval_s": 0.2,
    "probe_timeout_s": 0.3,
    "detection_s": 1.0,
    "never_seen_grace_s": 2.0,
    "placement_poll_s": 0.25,
    "control_read_timeout_s": 0.5,
    "failback_hysteresis_s": 4.0,
    "failback_shards_per_step": 2,
    "failback_step_interval_s": 0.5,
    "handoff_wait_s": 1.0,
    "control_handoff_wait_s": 3.0,
    "lead_backoff_max_s": 0.5,
    "lead_concurrency_max": 8,  # what every seed ran with (PLANE_SIM_VERSION pins schedules)
}


class SimPlane:
    """``config`` and ``settings``: the log's and the nodes' settings when not the simulator's
    own short ones (a scenario on production timings passes ``LogConfig(shard_count=...)`` and
    ``{}``); ``settings`` are ``NodeSettings`` fields over the defaults. ``drive_drills``: each
    node's drill driver runs its loop (a scenario that writes drill records itself turns it
    off and calls ``DrillDriver.step`` where it wants one)."""

    def __init__(
        self,
        rng: random.Random,
        regions: int,
        shard_count: int,
        *,
        config: LogConfig | None = None,
        settings: Mapping[str, Any] | None = None,
        drive_drills: bool = True,
        nodes_per_region: int = 1,
    ) -> None:
        self.rng = rng
        self.names = list(REGION_NAMES[:regions])
        #: every node of every region, by node target (a region of one node: its name)
        self.targets = [node_target(r, i) for r in self.names for i in range(nodes_per_region)]
        self.history = History()
        self.replicas: dict[str, MemoryReplica] = {
            r: WitnessedReplica(r, self.history) for r in self.names
        }
        self.net = SimNetwork(random.Random(rng.getrandbits(64)), self.replicas)
        self.counts: Counter[str] = Counter()
        self.cluster = ClusterConfig(
            shard_count=shard_count,
            regions=[
                RegionConfig(
                    name=r,
                    url=f"http://{r}.sim",
                    dsn=f"sqlite+aiosqlite:///{r}.sim",
                    more_nodes=[
                        NodeAddress(url=f"http://{r}{i}.sim") for i in range(1, nodes_per_region)
                    ],
                )
                for r in self.names
            ],
            local_supervisor=True,  # kill drills: the run kills and restarts their targets
        )
        self._settings = SIM_SETTINGS if settings is None else dict(settings)
        self._drive_drills = drive_drills
        self.config = config or LogConfig(
            shard_count=shard_count,
            replica_call_timeout_s=0.3,
            append_timeout_s=1.0,
            lead_timeout_s=1.0,
            replica_suspect_after_s=0.5,
            retry_backoff_max_s=0.1,
            commit_push_delay_s=0.01,
            # the control shard's push linger against the fold's poll (placement_poll_s 0.25 s):
            # as in production (0.02 s against 0.1 s) or longer, so that the leader's fold (and
            # a drill's fence after it) often acts on a record before any replica's hint has it
            records_commit_push_delay_s=rng.choice(RECORDS_PUSH_DELAYS_S),
        )
        self.skews_ms = {r: rng.choice([0, 0, -1500, 2500]) for r in self.names}
        self.processes = {t: RegionProcess(t) for t in self.targets}
        self.region_locks = {
            r.name: [SimRegionLock() for _ in range(r.node_count)] for r in self.cluster.regions
        }
        self.wiped: set[str] = set()
        self.commit_watchers: list[CommitWatcher] = []

    # --- processes ------------------------------------------------------------------------

    def settings(self, region: str, node_index: int = 0) -> NodeSettings:
        return NodeSettings(
            region=region, node_index=node_index, cluster=self.cluster, **self._settings
        )

    async def start_node(self, target: str) -> None:
        """Start the node process ``target`` (a region's name: its only or first node)."""
        process = self.processes[target]
        assert process.node is None
        region = target_region(target)
        index = self.targets.index(target) - self.targets.index(region)
        if self.cluster.region(region).node_count > 1:
            process.leases = [SimLease(lock) for lock in self.region_locks[region]]
        clock = SkewedClock(self.skews_ms[region])
        ops = OpsState()  # drills, halt, audit: folded from the control shard
        hole = BlackHole(region=region, ops=ops, clock=clock)
        links = black_holed_replicas(
            {dst: self.net.link(region, dst, node=target) for dst in self.names}, hole
        )
        node = LogNode(
            region=region,
            replicas=links,
            config=self.config,
            clock=clock,
            rng=random.Random(self.rng.getrandbits(64)),
            observer=partial(self._committed, region),
            listeners=[_LeaderChanges(self.counts)],
        )
        controller = build_controller(
            self.settings(region, index),
            self.cluster,
            node,
            links,
            SimProber(
                self.net,
                target,
                self._health_of,
                blocked=lambda peer: hole.blocks(peer, read_only=True),
            ),
            clock,
            random.Random(self.rng.getrandbits(64)),
            process.leases,
        )
        controller.record_listeners.append(ops.apply_entry)
        controller.control_excluded = ops.region_loss_targets
        urls = {r.name: r.url for r in self.cluster.regions}
        peers = httpx.AsyncClient(
            transport=BlackHoleTransport(
                SimPeerTransport(self.net, region, self.node, self.cluster.default_model_revision),
                hole,
                region_by_address(urls),
            )
        )
        load = LoadMeter(clock)
        node.add_listener(load)
        drills = DrillDriver(
            controller=controller,
            node=node,
            ops=ops,
            replicas=links,
            peers=peers,
            peer_url=fixed_peer_urls(urls),  # the transport finds the node (``SimPlane.node``)
            peer_secret=None,
            load=load,
            clock=clock,
            region_append_capacity_per_s=1e6,
            drill_token=partial(_token, random.Random(self.rng.getrandbits(64))),
        )
        process.node, process.controller = node, controller
        process.ops, process.drills, process.peers = ops, drills, peers
        await controller.start()
        if self._drive_drills:
            drills.start()

    async def stop_node(self, target: str) -> None:
        """The node process ``target`` dies: its memory is gone, its lease comes free."""
        process = self.processes[target]
        if process.drills is not None:
            await process.drills.close()
        if process.peers is not None:
            await process.peers.aclose()
        if process.controller is not None:
            await process.controller.close()
        if process.node is not None:
            await process.node.close()
        for lease in process.leases:
            await lease.close()
        process.node = process.controller = process.ops = process.drills = process.peers = None
        process.leases = []
        self.pause_node(target, False)

    def pause_node(self, target: str, paused: bool) -> None:
        """A paused node sends nothing and answers nothing (its calls hang), then wakes up with
        all its memory: leaders that believe they still lead, a stale placement, and the
        region's lease, if it held it."""
        self.processes[target].paused = paused
        if paused:
            self.net.frozen.add(target)
        else:
            self.net.frozen.discard(target)

    def resume_all(self) -> None:
        """Every paused node wakes up (``pause_node``)."""
        for process in self.processes.values():
            if process.paused:
                self.pause_node(process.name, False)

    def blip(self, region: str, on: bool) -> None:
        """A network blip at ``region``'s node: every packet it sends or is sent is lost (its
        calls hang until their deadlines), while its process runs on with all its memory."""
        if on:
            self.net.frozen.add(region)
        elif not self.processes[region].paused:
            self.net.frozen.discard(region)

    def _committed(
        self,
        region: str,
        shard: int,
        epoch: int,
        entries: Sequence[LogEntry],
        counted: Mapping[str, str | None],
    ) -> None:
        self.history.on_commit(region, shard, epoch, entries, counted)
        for watcher in self.commit_watchers:
            watcher(region, shard, entries)

    def _health_of(self, target: str, asking_region: str) -> Mapping[str, Any] | None:
        process = self.processes[target]
        if process.controller is None or process.paused:
            return None
        if asking_region != process.region and not process.controller.answers_probes():
            return None
        return process.controller.health_reply()

    # --- databases ------------------------------------------------------------------------

    def wipe_replica(self, region: str) -> None:
        self.replicas[region].wipe()
        self.wiped.add(region)

    async def rebuild_replica(self, region: str) -> None:
        """The operator's ``convplane replica rebuild``, run from another region."""
        source = next(r for r in self.names if r != region)
        links = {dst: self.net.link(source, dst) for dst in self.names}
        await rebuild_replica(links, region, range(self.cluster.shard_count + 1), self.config)
        self.wiped.discard(region)

    # --- views ----------------------------------------------------------------------------

    def serving(self) -> list[RegionProcess]:
        return [p for p in self.processes.values() if p.serving]

    def controllers(self) -> list[Controller]:
        return [p.controller for p in self.processes.values() if p.controller is not None]

    def leaders_of(self, shard: int) -> list[str]:
        """The regions of the serving nodes that lead ``shard`` (a region twice: two of its
        nodes do)."""
        return [
            target_region(p.name)
            for p in self.serving()
            if p.node is not None and p.node.leads(shard)
        ]

    def node(self, name: str, shard: int | None = None) -> LogNode | None:
        """A serving node by its target, or by its region's name: the region's serving node
        that leads ``shard`` while the region does (None: the control shard; the region's only
        node, in a region of one)."""
        if "/" in name or self.cluster.region(name).node_count == 1:
            process = self.processes[name]
            return process.node if process.serving else None
        shard = self.cluster.shard_count if shard is None else shard
        of_region = [p for p in self.serving() if target_region(p.name) == name]
        leading = [
            p for p in of_region if p.controller is not None and p.controller.slots.leads(shard)
        ]
        chosen = leading or of_region
        return chosen[0].node if chosen else None

    async def close(self) -> None:
        for target in self.targets:
            await self.stop_node(target)
        await self.net.close()


Action = Callable[[], Any]


def _token(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}"

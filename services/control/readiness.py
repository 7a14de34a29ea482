"""Readiness of each region's loss, kept fresh at the control leader (``regions.readiness``).

Every node runs a ``ReadinessMonitor`` as a supervised loop (``readiness``, every
``STEP_S`` or ``readiness_interval_s`` when that is shorter); only the node that leads the
control shard evaluates, once the last evaluation is ``readiness_interval_s`` old (it holds the
drill records the score reads, and it is the one node the API asks); the others drop what they
evaluated while they led, so one node at a time exports the gauges. ``GET /v1/readiness``
answers the last evaluation, or evaluates at once when there is none, it is older than the
interval, or ``refresh`` asks for it; concurrent askers share one evaluation.

An evaluation reads what a drill's preflight reads: the placement, the membership view, the
plane's live load (every peer's ``/peer/drills/load``, one bounded call each) and the active
conversations on each region's shards from this region's replica (bounded as a whole by
``MOVED_READS_TIMEOUT_S``; past it the replay bound is unknown, never waited for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from eventlog.aio import bounded
from eventlog.clock import Clock
from eventlog.replica import ReplicaStore
from regions.drill_plan import LiveLoad, MovedLoad
from regions.membership import statuses
from regions.ops_state import OpsState
from regions.readiness import STATUSES, PlaneFacts, PlaneReadiness, ReadinessPolicy, evaluate_plane
from services.control.controller import Controller
from services.control.drills.load import PlaneLoad, moved_load

#: how often the loop looks whether this node leads the control shard and its evaluation is due
STEP_S = 15.0
#: the replica reads of one evaluation (the active conversations on every region's shards)
MOVED_READS_TIMEOUT_S = 10.0

#: the plane's live load as the drills measure it (``services.control.drills.load.plane_load``)
LoadSampler = Callable[[], Awaitable[PlaneLoad]]


class ReadinessMonitor:
    def __init__(
        self,
        *,
        controller: Controller,
        ops: OpsState,
        replica: ReplicaStore | None,
        sample_load: LoadSampler,
        clock: Clock,
        region_append_capacity_per_s: float,
        policy: ReadinessPolicy,
        interval_s: float,
    ) -> None:
        self._controller = controller
        self._ops = ops
        self._replica = replica
        self._sample_load = sample_load
        self._clock = clock
        self._capacity_per_s = region_append_capacity_per_s
        self.policy = policy
        self.interval_s = interval_s
        self._lock = asyncio.Lock()
        self._evaluated_at_s = float("-inf")
        #: the last evaluation, while this node leads the control shard
        self.latest: PlaneReadiness | None = None
        #: evaluations started and finished (one at a time, under the lock)
        self._started = 0
        self.evaluations = 0

    @property
    def step_s(self) -> float:
        return min(STEP_S, self.interval_s)

    async def step(self) -> None:
        """The supervised loop's step."""
        if not self._controller.node.leads(self._controller.control_shard):
            self.latest = None  # another node evaluates (and exports) now
            return
        await self.read(refresh=False)

    async def read_barrier(self) -> None:
        """``Controller.read_barrier``: NotLeader (the API forwards) unless this node leads
        the control shard and has applied every drill record committed before the call."""
        await self._controller.read_barrier()

    async def read(self, *, refresh: bool) -> PlaneReadiness:
        """For the API, at the control leader after its read barrier: the last evaluation
        unless it is missing, older than the interval or ``refresh`` asks for a new one."""
        latest = self.latest
        age_s = self._clock.monotonic() - self._evaluated_at_s
        if latest is not None and not refresh and age_s < self.interval_s:
            return latest
        return await self.evaluate()

    async def evaluate(self) -> PlaneReadiness:
        started_before = self._started
        async with self._lock:
            if self.latest is not None and self.evaluations > started_before:
                return self.latest  # one that started after this ask finished meanwhile
            self._started += 1
            started_s = self._clock.monotonic()
            readiness = evaluate_plane(await self._facts(), self.policy)
            self.latest, self._evaluated_at_s = readiness, started_s
            self.evaluations += 1
            return readiness

    async def _facts(self) -> PlaneFacts:
        controller = self._controller
        placement = controller.placement()
        weights = controller.cluster.weights()
        load = await self._sample_load()
        since_ms = self._clock.wall_ms() - int(controller.cluster.replay.replay_window_s * 1000)
        try:
            moved = await bounded(
                self._moved_loads({r: placement.shards_of(r) for r in weights}, since_ms),
                MOVED_READS_TIMEOUT_S,
            )
        except TimeoutError:
            moved = {}
        replicas = len(weights)
        return PlaneFacts(
            now_ms=self._clock.wall_ms(),
            statuses=statuses(controller.membership.view(self._clock.monotonic())),
            weights=weights,
            placement=placement,
            write_quorum=controller.node.config.quorum(replicas),
            prepare_quorum=controller.node.config.prepare_quorum(replicas),
            loads={r: self._live_load(load, r) for r in weights},
            moved=moved,
            drills=list(self._ops.drills.values()),
        )

    def _live_load(self, load: PlaneLoad, lost: str) -> LiveLoad:
        return LiveLoad(
            load.append_rate_per_s,
            self._capacity_per_s,
            spare_prefill_tokens_per_s=load.spare_prefill_tokens_per_s(lost),
            live_prefill_tokens_per_s=load.live_prefill_tokens_per_s(),
            survivor_prefill_capacity_tokens_per_s=load.survivor_prefill_capacity_tokens_per_s(
                lost
            ),
        )

    async def _moved_loads(
        self, shards: Mapping[str, list[int]], since_ms: int
    ) -> dict[str, MovedLoad | None]:
        return {
            region: await moved_load(self._replica, mine, since_ms=since_ms)
            for region, mine in shards.items()
        }


class ReadinessCollector(Collector):
    """The last evaluation as gauges (none while this node does not lead the control shard:
    the families are there, empty, so rules and dashboards always find their names)."""

    def __init__(self, monitor: ReadinessMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        score = GaugeMetricFamily(
            "convplane_readiness_score",
            "readiness to lose the region, 0 to 100 (regions.readiness: quorum, capacity, "
            "replay bound, last passed drill decayed by its half-life)",
            labels=["region"],
        )
        status = GaugeMetricFamily(
            "convplane_readiness_status",
            "1 for the region's readiness status (ready, at_risk, not_ready), 0 for the others",
            labels=["region", "status"],
        )
        plane = GaugeMetricFamily(
            "convplane_readiness_plane_score",
            "readiness of the plane, 0 to 100: its least ready region's score",
        )
        age = GaugeMetricFamily(
            "convplane_readiness_evaluated_timestamp_seconds",
            "when the control leader last evaluated readiness (Unix time)",
        )
        latest = self._monitor.latest
        if latest is not None:
            for region in latest.regions:
                score.add_metric([region.region], region.score)
                for name in STATUSES:
                    status.add_metric([region.region, name], 1.0 if region.status == name else 0.0)
            plane.add_metric([], latest.score)
            age.add_metric([], latest.evaluated_at_ms / 1000)
        yield from (score, status, plane, age)

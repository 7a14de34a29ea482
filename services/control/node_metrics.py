"""A region node's own state as Prometheus series: leadership, regions, replicas, placement,
failovers and drills. ``services.api.metrics`` holds the request-path series; this module holds
what the controller, the log node and the drills know.

Most series are read from the state at scrape time (a custom collector: no second copy of the
numbers to keep in step, nothing on the request path). What happens once and is gone (a failover,
a drill's verdict) is counted by listeners the node and the controller already call.

Labels are region names from the cluster file, drill kinds and verdicts, replay statuses:
all bounded. No conversation, tenant or user id is ever a label.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from eventlog.clock import Clock
from eventlog.leader import ShardLeader
from eventlog.model import LogEntry
from regions.drills import KINDS, Verdict
from regions.membership import RegionStatus
from regions.ops_state import DRILL_RECORD, OpsState
from replay.model import ReplayResult, ReplayStatus
from services.control.controller import Controller

#: RTO of one failed-over shard: from a few hundred ms (fast detection) to minutes
RTO_BUCKETS_S = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: one replay job's prefill on an engine
REPLAY_JOB_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REGION_STATUSES: tuple[RegionStatus, ...] = get_args(RegionStatus)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
REPLAY_STATUSES: frozenset[str] = frozenset(get_args(ReplayStatus))


class NodeStateCollector(Collector):
    """Leadership, region views, replica lag and placement of one node, read at each scrape."""

    def __init__(self, controller: Controller, ops: OpsState | None, clock: Clock) -> None:
        self._controller = controller
        self._ops = ops
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        controller = self._controller
        node = controller.node
        region = controller.region
        control_shard = controller.control_shard
        data_shards = [s for s in node.led_shards() if s != control_shard]
        yield _gauge(
            "convplane_shards_led",
            "data shards this region's node leads and serves now",
            region,
            len(data_shards),
        )
        yield _gauge(
            "convplane_control_shard_led",
            "1 while this region's node leads the control shard",
            region,
            1.0 if node.leads(control_shard) else 0.0,
        )
        leaders = [leader for s in node.led_shards() if (leader := node.leader(s)) is not None]
        yield _gauge(
            "convplane_shards_without_quorum",
            "shards led here whose write quorum of replicas does not look reachable: their "
            "appends fail with no_quorum",
            region,
            sum(1 for leader in leaders if not leader.quorum_reachable()),
        )
        yield from _replica_lag(leaders)
        yield from self._region_status()
        yield CounterMetricFamily(
            "convplane_placement_changes",
            "placement changes committed to the control shard (the placement's version)",
            value=controller.placement().version,
        )
        if self._ops is not None:
            active = GaugeMetricFamily(
                "convplane_drills_active",
                "drills running now, by kind (their start and end are dashboard annotations)",
                labels=["kind"],
            )
            running = [d.spec.kind for d in self._ops.active_drills()]
            for kind in KINDS:
                active.add_metric([kind], running.count(kind))
            yield active

    def _region_status(self) -> Iterator[Metric]:
        controller = self._controller
        now_s = self._clock.monotonic()
        status = GaugeMetricFamily(
            "convplane_region_status",
            "1 for each region's status in this node's view (up, suspected, down)",
            labels=["region", "status"],
        )
        for name, view in sorted(controller.membership.view(now_s).items()):
            for value in REGION_STATUSES:
                status.add_metric([name, value], 1.0 if view.status == value else 0.0)
        yield status


def _gauge(name: str, documentation: str, region: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["region"])
    family.add_metric([region], value)
    return family


def _replica_lag(leaders: list[ShardLeader]) -> Iterator[Metric]:
    entries = GaugeMetricFamily(
        "convplane_replica_lag_entries",
        "most entries a region's replica lacks behind the leader, over the shards led here",
        labels=["region"],
    )
    seconds = GaugeMetricFamily(
        "convplane_replica_lag_seconds",
        "longest a region's replica has lacked entries of a shard led here",
        labels=["region"],
    )
    worst: dict[str, tuple[int, float]] = {}
    for leader in leaders:
        for replica, lag_entries, lag_s in leader.replica_lag():
            before = worst.get(replica, (0, 0.0))
            worst[replica] = (max(before[0], lag_entries), max(before[1], lag_s))
    for replica, (lag_entries, lag_s) in sorted(worst.items()):
        entries.add_metric([replica], lag_entries)
        seconds.add_metric([replica], lag_s)
    yield entries
    yield seconds


class FailoverRecorder:
    """A ``LogListener``: counts the shards this node took over, and their RTO.

    A take-over is a *failover* when the previous leader's region is not up in this node's view
    (else a planned handoff). Its RTO is the time from the last probe the previous region
    answered to the moment this node serves the shard: an upper bound on how long the shard had
    no serving leader, as this node saw it."""

    def __init__(self, controller: Controller, clock: Clock, registry: CollectorRegistry) -> None:
        self._controller = controller
        self._clock = clock
        self.failovers = Counter(
            "convplane_failovers",
            "shards this region took over from a failed region, by the region that failed",
            ["from_region"],
            registry=registry,
        )
        self.handoffs = Counter(
            "convplane_shard_handoffs",
            "shards this region took over in a planned handoff (evacuate, restore, failback)",
            ["from_region"],
            registry=registry,
        )
        self.rto = Histogram(
            "convplane_failover_rto_seconds",
            "per failed-over shard: from the failed region's last answered probe to serving here",
            buckets=RTO_BUCKETS_S,
            registry=registry,
        )

    def shard_led(self, shard: int, epoch: int, previous_region: str | None) -> None:
        controller = self._controller
        if previous_region is None or previous_region == controller.region:
            return
        if previous_region not in controller.membership.regions:
            return  # a name from no cluster file: never a label
        now_s = self._clock.monotonic()
        if controller.membership.status(previous_region, now_s) == "up":
            self.handoffs.labels(previous_region).inc()
            return
        self.failovers.labels(previous_region).inc()
        last_heard_s = controller.membership.last_heard_s(previous_region)
        if last_heard_s is not None:
            self.rto.observe(now_s - last_heard_s)

    def conversation_written(self, tenant_id: str, conversation_id: str, event_type: str) -> None:
        return None


class DrillVerdictRecorder:
    """A control-record listener (``Controller.record_listeners``, after the drills' own fold):
    counts each drill once, when its verdict is first seen. Drills that ended before this
    process started (folded from the control shard's history at start) are not counted again:
    a restart resets the counter to 0, as Prometheus expects of a counter."""

    def __init__(self, ops: OpsState, registry: CollectorRegistry, started_wall_ms: int) -> None:
        self._ops = ops
        self._started_wall_ms = started_wall_ms
        self._counted: set[str] = set()
        self.drills = Counter(
            "convplane_drills", "drills ended, by verdict", ["verdict"], registry=registry
        )
        for verdict in VERDICTS:
            self.drills.labels(verdict)

    def __call__(self, entry: LogEntry, placement_applied: bool) -> None:
        if entry.event_type != DRILL_RECORD:
            return
        for drill in self._ops.drills.values():
            if drill.verdict is None or drill.drill_id in self._counted:
                continue
            self._counted.add(drill.drill_id)
            if (drill.ended_at_ms or 0) >= self._started_wall_ms:
                self.drills.labels(drill.verdict).inc()
        # bounded by the drills OpsState remembers
        self._counted &= set(self._ops.drills)


class ReplayJobRecorder:
    """A replay-result listener: each finished job's engine time, by status."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram(
            "convplane_replay_job_duration_seconds",
            "engine time of one replay job (prefill of a transcript), by result status",
            ["status"],
            buckets=REPLAY_JOB_BUCKETS_S,
            registry=registry,
        )

    def __call__(self, result: ReplayResult) -> None:
        status = result.status if result.status in REPLAY_STATUSES else "other"
        self.latency.labels(status).observe(max(0.0, result.duration_ms / 1000))

"""The node metrics that count events once (``services.control.node_metrics``) and the leader's replica
lag they export (``ShardLeader.replica_lag``)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from eventlog.config import LogConfig
from eventlog.errors import ReplicaUnavailable
from eventlog.leader import ShardLeader
from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply, LogEntry
from eventlog.node import LogNode
from regions.drills import DrillSpec, request_abort, start
from regions.ops_state import DRILL_RECORD, OpsState
from services.config import ClusterConfig, NodeSettings, RegionConfig
from services.control.controller import Controller
from services.control.node_metrics import DrillVerdictRecorder, FailoverRecorder
from tests.unit.clocks import ManualClock

T0 = 1_767_225_600_000


def _record(ops: OpsState, lsn: int, body: dict[str, object]) -> LogEntry:
    text = json.dumps(body)
    ops.apply(lsn, DRILL_RECORD, text)
    return LogEntry(lsn, 1, "", "", 0, DRILL_RECORD, None, None, 0, T0, text)


def _count(registry: CollectorRegistry, verdict: str) -> float:
    value = registry.get_sample_value("convplane_drills_total", {"verdict": verdict})
    assert value is not None
    return value


def test_each_drill_is_counted_once_by_verdict_and_history_is_not() -> None:
    ops, registry = OpsState(), CollectorRegistry()
    recorder = DrillVerdictRecorder(ops, registry, started_wall_ms=T0)
    spec = DrillSpec(kind="region-loss", region="us-east", hold_s=10.0, reason="drill")
    # a drill that ended before this process started (its history, folded at start)
    old = start("d0", spec, T0 - 60_000)
    recorder(_record(ops, 1, old.to_body()), False)
    old_end = replace(old, rev=2, verdict="passed", ended_at_ms=T0 - 1_000)
    recorder(_record(ops, 2, old_end.to_body()), False)
    assert _count(registry, "passed") == 0
    # a drill that ends now, seen in several records after its verdict
    drill = start("d1", spec, T0 + 1_000)
    recorder(_record(ops, 3, drill.to_body()), False)
    assert _count(registry, "aborted") == 0
    aborting = request_abort(drill, "sre: stop", T0 + 2_000)
    assert aborting is not None
    ended = replace(aborting, verdict="aborted", ended_at_ms=T0 + 3_000)
    recorder(_record(ops, 4, ended.to_body()), False)
    recorder(_record(ops, 5, {**ended.to_body(), "rev": ended.rev + 1}), False)
    assert _count(registry, "aborted") == 1
    assert _count(registry, "failed") == 0


class DownReplica(MemoryReplica):
    """A replica whose appends fail (its database is gone); it still answers prepares."""

    async def append(self, *args: Any, **kwargs: Any) -> AppendReply:
        raise ReplicaUnavailable(f"replica {self.region} is down")


async def test_replica_lag_counts_entries_and_time_a_replica_lacks() -> None:
    clock = ManualClock(now_s=10.0, virtual_sleep=False)  # time moves only when set here
    replicas = {"a": MemoryReplica("a"), "b": MemoryReplica("b"), "c": DownReplica("c")}
    leader = ShardLeader(
        shard=0,
        region="a",
        replicas=replicas,
        config=LogConfig(shard_count=1),
        clock=clock,
        rng=random.Random(1),
    )
    try:
        await leader.lead()  # the barrier commits on a and b
        assert leader.last_lsn >= 1
        clock.now_s = 25.0
        lags = {region: (entries, seconds) for region, entries, seconds in leader.replica_lag()}
        assert lags["a"] == (0, 0.0) and lags["b"] == (0, 0.0)
        assert lags["c"] == (leader.last_lsn, 15.0)  # lacking since the leader began
        assert leader.quorum_reachable()
    finally:
        await leader.close()


class NoPeers:
    async def health(self, region: str) -> None:
        return None


def _controller(clock: ManualClock) -> Controller:
    regions = ("east", "north", "west")
    cluster = ClusterConfig(
        regions=[
            RegionConfig(name=r, url=f"http://{r}.test", dsn=f"memory://{r}") for r in regions
        ],
        shard_count=4,
        default_model_revision="m-1",
    )
    replicas = {r: MemoryReplica(r) for r in regions}
    node = LogNode(
        region="east",
        replicas=replicas,
        config=LogConfig(shard_count=4),
        clock=clock,
        rng=random.Random(1),
    )
    return Controller(
        settings=NodeSettings(region="east", cluster=cluster),
        cluster=cluster,
        node=node,
        replicas=replicas,
        prober=NoPeers(),
        clock=clock,
        rng=random.Random(1),
    )


def test_a_take_over_from_a_failed_region_is_a_failover_with_its_rto() -> None:
    clock = ManualClock(now_s=100.0)
    controller = _controller(clock)
    registry = CollectorRegistry()
    recorder = FailoverRecorder(controller, clock, registry)
    membership = controller.membership
    membership.probe_ok("west", 100.0, suspects=())
    membership.probe_ok("north", 100.0, suspects=())
    clock.now_s = 103.0
    membership.probe_ok("north", 103.0, suspects=["west"])  # west went quiet at 100
    recorder.shard_led(1, 2, "west")  # west is suspected: a failover, 3 s after it was last heard
    recorder.shard_led(2, 2, "north")  # north is up: a planned handoff
    recorder.shard_led(3, 1, None)  # first leader: neither
    recorder.shard_led(0, 3, "east")  # this region already led it: neither
    recorder.shard_led(1, 3, "nowhere")  # not a region of the cluster: never a label

    def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
        return registry.get_sample_value(name, labels or {})

    assert sample("convplane_failovers_total", {"from_region": "west"}) == 1
    assert sample("convplane_failovers_total", {"from_region": "north"}) is None
    assert sample("convplane_shard_handoffs_total", {"from_region": "north"}) == 1
    assert sample("convplane_failover_rto_seconds_count") == 1
    assert sample("convplane_failover_rto_seconds_sum") == 3.0
    assert sample("convplane_failover_rto_seconds_bucket", {"le": "2.0"}) == 0
    assert sample("convplane_failover_rto_seconds_bucket", {"le": "3.0"}) == 1

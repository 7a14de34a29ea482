"""Controllers of a three-region plane on in-memory replicas, for unit tests of control-shard
behaviour (no peers: every region counts as alive until declared down)."""

from __future__ import annotations

import random

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from regions.ops_state import OpsState
from services.config import ClusterConfig, NodeSettings, RegionConfig
from services.control.controller import Controller

REGIONS = ("a", "b", "c")
SHARDS = 4


class NoPeers:
    async def health(self, region: str) -> None:
        return None


def controller(
    region: str, replicas: dict[str, MemoryReplica], *, commit_push_delay_s: float = 0.02
) -> tuple[Controller, OpsState]:
    """``commit_push_delay_s``: how long an idle leader (of any shard) lingers before pushing
    its commit position (a test of who learns what from replica hints makes it long)."""
    cluster = ClusterConfig(
        shard_count=SHARDS,
        regions=[RegionConfig(name=r, url=f"http://{r}.invalid", dsn=f"memory://{r}")
                 for r in REGIONS],
    )  # fmt: skip
    clock = LoopClock()
    config = LogConfig(shard_count=SHARDS, commit_push_delay_s=commit_push_delay_s,
                       records_commit_push_delay_s=commit_push_delay_s)  # fmt: skip
    node = LogNode(region=region, replicas=replicas, config=config, clock=clock,
                   rng=random.Random(1))  # fmt: skip
    control = Controller(settings=NodeSettings(region=region, cluster=cluster), cluster=cluster,
                         node=node, replicas=replicas, prober=NoPeers(), clock=clock,
                         rng=random.Random(2))  # fmt: skip
    ops = OpsState()
    control.record_listeners.append(ops.apply_entry)  # wired as services.bootstrap.node does
    control.control_excluded = ops.region_loss_targets
    return control, ops

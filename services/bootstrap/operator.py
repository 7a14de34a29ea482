"""Wiring for an operator's tools (``convplane replica status | rebuild``): every region's replica
store straight from the cluster file (an operator's credentials; no node needs to run), and the
log's identity sweep over them."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.identity import Verdict
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from services.bootstrap.node import open_replica_stores
from services.config import load_cluster


@dataclass(frozen=True)
class OperatorStores:
    stores: Mapping[str, ReplicaStore]
    config: LogConfig  # the cluster's shard count and write quorum


@asynccontextmanager
async def open_operator_stores(cluster_file: Path) -> AsyncIterator[OperatorStores]:
    """Every region's replica store from ``cluster_file``, closed on exit."""
    cluster = load_cluster(cluster_file)
    async with AsyncExitStack() as stack:
        stores = await open_replica_stores(cluster, SystemClock(), stack)
        config = LogConfig(shard_count=cluster.shard_count, write_quorum=cluster.write_quorum)
        yield OperatorStores(stores, config)


async def sweep_identities(opened: OperatorStores) -> Mapping[str, Verdict]:
    """One identity sweep over every replica, as a node's would run (``eventlog.identity``):
    each region's verdict (admitted, quarantined or unknown)."""
    node = LogNode(
        region=next(iter(opened.stores)),
        replicas=opened.stores,
        config=opened.config,
        clock=SystemClock(),
        rng=random.Random(),
    )
    await node.verify_replicas()
    return node.identity.verdicts

"""Wiring for an operator's tools (``convplane replica status | rebuild``): every region's replica
store straight from the cluster file (an operator's credentials; no node needs to run), and the
log's identity sweep over them.

An operator's command waits longer for a store than a node's append does. A node gives up on a
replica after seconds, because a quorum of the others answers for it; a command that must write
to every store (a quarantine, a re-admission) has no quorum to fall back on. A SQLite replica's
write lock is held by every leading node in turn, and a slow disk's fsync (a loaded CI machine)
held it past the node's deadline for the whole of a restore's three tries.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.identity import Verdict
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store
from services.bootstrap.node import open_replica_stores
from services.config import load_cluster


@dataclass(frozen=True)
class OperatorStores:
    stores: Mapping[str, ReplicaStore]
    config: LogConfig  # the cluster's shard count and write quorum


#: how long an operator's command waits for one store call (a SQLite write lock included)
OPERATOR_STORE_CALL_TIMEOUT_S = 30.0


@asynccontextmanager
async def open_operator_stores(cluster_file: Path) -> AsyncIterator[OperatorStores]:
    """Every region's replica store from ``cluster_file``, closed on exit; each call may take
    ``OPERATOR_STORE_CALL_TIMEOUT_S``."""
    cluster = load_cluster(cluster_file)
    async with AsyncExitStack() as stack:
        opener = partial(open_replica_store, statement_timeout_s=OPERATOR_STORE_CALL_TIMEOUT_S)
        stores = await open_replica_stores(cluster, SystemClock(), stack, open_store=opener)
        config = LogConfig(
            shard_count=cluster.shard_count,
            write_quorum=cluster.write_quorum,
            replica_call_timeout_s=OPERATOR_STORE_CALL_TIMEOUT_S + 1,  # the store's own first
        )
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

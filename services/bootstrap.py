"""Wiring of one region node: the one place where adapters meet the core.

``open_runtime(settings)`` opens a replica store per region (the leader writes to every region's
database directly), builds the ``LogNode``, opens the pooled HTTP client used for forwarding and
probing, starts the ``services.controller.Controller`` (failure detection, the control shard,
leading the shards the committed placement assigns here, leader hints for the rest), and closes
it all in reverse order on exit.
"""

from __future__ import annotations

import os
import random
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import httpx

from eventlog.clock import Clock, SystemClock
from eventlog.config import LogConfig
from eventlog.conversations import ConversationLog
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store
from services.cluster_tls import client_ssl_context, node_tls
from services.config import ClusterConfig, NodeSettings
from services.controller import Controller
from services.peer_probe import HttpPeerProber
from services.replay.service import ReplayService
from services.replay.wiring import open_replay_service


@dataclass
class NodeRuntime:
    """What the API needs from the wired node."""

    region: str
    cluster: ClusterConfig
    log: ConversationLog
    peers: httpx.AsyncClient
    clock: Clock
    rng: random.Random
    readiness: Callable[[], tuple[int, int]]  # (shards placed here, shards led now)
    controller: Controller | None = None  # failure detection, placement, failover
    replay: ReplayService | None = None  # KV replay of conversations whose shards moved here


RuntimeFactory = Callable[[NodeSettings], AbstractAsyncContextManager[NodeRuntime]]


async def open_replica_stores(
    cluster: ClusterConfig, clock: Clock, stack: AsyncExitStack, source_region: str | None = None
) -> dict[str, ReplicaStore]:
    stores: dict[str, ReplicaStore] = {}
    for region in cluster.regions:
        dsn = region.dsn_from.get(source_region, region.dsn) if source_region else region.dsn
        store = await open_replica_store(dsn, region.name, clock=clock)
        stack.push_async_callback(store.close)
        stores[region.name] = store
    return stores


def build_log_node(
    settings: NodeSettings,
    cluster: ClusterConfig,
    replicas: Mapping[str, ReplicaStore],
    clock: Clock,
    rng: random.Random,
) -> LogNode:
    config = LogConfig(shard_count=cluster.shard_count, write_quorum=cluster.write_quorum)
    return LogNode(region=settings.region, replicas=replicas, config=config, clock=clock, rng=rng)


def peer_client(settings: NodeSettings) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=settings.forward_connections_max,
        max_keepalive_connections=settings.forward_connections_max,
    )
    timeout_s = settings.max_deadline_ms / 1000  # each forward passes its own, shorter timeout
    tls = node_tls(settings)  # mutual TLS to peers' https listeners (services.cluster_tls)
    verify: ssl.SSLContext | bool = client_ssl_context(tls) if tls is not None else True
    return httpx.AsyncClient(limits=limits, timeout=timeout_s, trust_env=False, verify=verify)


@asynccontextmanager
async def open_runtime(settings: NodeSettings) -> AsyncIterator[NodeRuntime]:
    cluster = settings.load_cluster()
    clock = SystemClock()
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    async with AsyncExitStack() as stack:
        replicas = await open_replica_stores(cluster, clock, stack, settings.region)
        node = build_log_node(settings, cluster, replicas, clock, rng)
        stack.push_async_callback(node.close)
        peers = await stack.enter_async_context(peer_client(settings))
        # Replay listens to the node before the controller leads anything (moves are seen).
        replay = await stack.enter_async_context(
            open_replay_service(
                region=settings.region,
                shard_count=cluster.shard_count,
                config=cluster.replay,
                node=node,
                replicas=replicas,
                clock=clock,
                rng=rng,
                peer_secret=cluster.peer_secret,  # the cache-salt key's fallback
            )
        )
        # The controller leads the shards the committed placement (at first the static one,
        # place_shards) assigns here, follows failovers and failbacks, and sets leader hints.
        controller = Controller(
            settings=settings,
            cluster=cluster,
            node=node,
            replicas=replicas,
            prober=HttpPeerProber(
                peers,
                {r.name: r.peer_url_for(settings.region) for r in cluster.regions},
                timeout_s=settings.probe_timeout_s,
                peer_secret=cluster.peer_secret,
            ),
            clock=clock,
            rng=rng,
        )
        # the own region's replica never counts as unreachable: the node reaches it directly
        node.set_region_health(
            lambda region: (
                region != settings.region
                and region in controller.membership.suspects(clock.monotonic())
            )
        )
        await controller.start()
        stack.push_async_callback(controller.close)
        yield NodeRuntime(
            settings.region,
            cluster,
            node,
            peers,
            clock,
            rng,
            controller.readiness,
            controller,
            replay,
        )

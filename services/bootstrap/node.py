"""Wiring of one region node: the one place where adapters meet the core.

``open_runtime(settings, adapters)`` opens a replica store per region (the leader writes to every region's
database directly), builds the ``LogNode``, opens the pooled HTTP client used for forwarding and
probing, starts the ``services.control.controller.Controller`` (failure detection, the control shard,
leading the shards the committed placement assigns here, leader hints for the rest), and closes
it all in reverse order on exit. ``NodeAdapters`` are what it takes from the world (the clock,
how a replica store is opened, the peer HTTP client): production's by default, in-memory ones in
the unit tier.
"""

from __future__ import annotations

import os
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import httpx

from eventlog.clock import Clock, SystemClock
from eventlog.config import LogConfig
from eventlog.conversations import ConversationLog
from eventlog.http_headers import PEER_AUTH_HEADER, SOURCE_REGION_HEADER
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store
from eventlog.stores.region_lease import RegionLease, open_region_lease
from regions.error_budget import BurnPolicy
from regions.ops_state import OpsState
from regions.practice_state import PracticeState
from regions.readiness import ReadinessPolicy
from services.api.forward_exchange import BatchExchange, StreamBatchExchange, idle_reuse_s
from services.bootstrap.replay import open_replay_service
from services.bootstrap.replica_timing import (
    ReplicaInstruments,
    replica_call_histogram,
    timed_replicas,
)
from services.cluster_tls import client_ssl_context, node_tls
from services.config import ClusterConfig, NodeSettings
from services.control.controller import Controller
from services.control.drills.driver import DrillDriver
from services.control.drills.faults import (
    BlackHole,
    BlackHoleTransport,
    black_holed_replicas,
    region_by_address,
)
from services.control.drills.load import LoadMeter, PlaneLoad, plane_load
from services.control.peer_probe import HttpPeerProber, OwnedPeerProber, PeerProber
from services.control.practice import PracticeRunner
from services.control.readiness import LoadSampler, ReadinessMonitor
from services.control.region_nodes import RegionNodes, node_target, target_region
from services.peer_protocol import PEER_PROTOCOL_HEADERS
from services.replay.service import ReplayService


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
    drills: DrillDriver | None = (
        None  # drills, halt switch, audit log (services.control.drills.driver)
    )
    #: replica call timing and tracing, set by the app (services.bootstrap.replica_timing)
    replica_instruments: ReplicaInstruments | None = None
    #: how forward batches travel (None: through ``peers``, services.api.forward_exchange)
    forward_exchange: BatchExchange | None = None
    #: readiness of each region's loss, at the control leader (services.control.readiness)
    loss_readiness: ReadinessMonitor | None = None
    practice: PracticeRunner | None = None  # scheduled drills (services.control.practice)


RuntimeFactory = Callable[[NodeSettings], AbstractAsyncContextManager[NodeRuntime]]
StoreOpener = Callable[..., Awaitable[ReplicaStore]]  # (dsn, region, *, clock)
TransportWrap = Callable[[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport]
PeerClientFactory = Callable[[NodeSettings, TransportWrap | None], httpx.AsyncClient]


async def open_replica_stores(
    cluster: ClusterConfig,
    clock: Clock,
    stack: AsyncExitStack,
    source_region: str | None = None,
    open_store: StoreOpener = open_replica_store,
) -> dict[str, ReplicaStore]:
    stores: dict[str, ReplicaStore] = {}
    for region in cluster.regions:
        dsn = region.dsn_from.get(source_region, region.dsn) if source_region else region.dsn
        store = await open_store(dsn, region.name, clock=clock)
        stack.push_async_callback(store.close)
        stores[region.name] = store
    return stores


#: each call of a region lease (``eventlog.stores.region_lease``): a holder whose own database
#: does not answer within it gives the lease up (the database is gone for it, so is the region)
LEASE_CALL_TIMEOUT_S = 5.0


async def open_own_leases(settings: NodeSettings, cluster: ClusterConfig) -> list[RegionLease]:
    """The leases of this node's region's node slots, one per node, when the region has several
    nodes (none: one)."""
    own = cluster.region(settings.region)
    if own.node_count == 1:
        return []
    dsn = own.dsn_from.get(settings.region, own.dsn)
    return [
        await open_region_lease(dsn, settings.region, slot, timeout_s=LEASE_CALL_TIMEOUT_S)
        for slot in range(own.node_count)
    ]


def _region_of(by_address: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``host:port`` -> region, where ``by_address`` may answer a node's probe target."""

    def region_of(address: str) -> str | None:
        found = by_address(address)
        return None if found is None else target_region(found)

    return region_of


def build_log_node(
    settings: NodeSettings,
    cluster: ClusterConfig,
    replicas: Mapping[str, ReplicaStore],
    clock: Clock,
    rng: random.Random,
) -> LogNode:
    config = LogConfig(shard_count=cluster.shard_count, write_quorum=cluster.write_quorum)
    return LogNode(region=settings.region, replicas=replicas, config=config, clock=clock, rng=rng)


def build_controller(
    settings: NodeSettings,
    cluster: ClusterConfig,
    node: LogNode,
    replicas: Mapping[str, ReplicaStore],
    prober: PeerProber,
    clock: Clock,
    rng: random.Random,
    leases: Sequence[RegionLease] = (),
) -> Controller:
    """The controller over ``node``, and the node told which regions the controller suspects
    (a suspected region's replica is not waited for). The whole-plane simulator
    (``services.plane_sim``) wires its nodes with this too. ``leases``: the region's node
    slots', where it has several nodes."""
    controller = Controller(
        settings=settings,
        cluster=cluster,
        node=node,
        replicas=replicas,
        prober=prober,
        clock=clock,
        rng=rng,
        leases=leases,
    )
    # the own region's replica never counts as unreachable: the node reaches it directly
    node.set_region_health(
        lambda region: (
            region != settings.region
            and controller.membership.suspects_region(region, clock.monotonic())
        )
    )
    return controller


def peer_client(
    settings: NodeSettings,
    wrap: TransportWrap | None = None,
) -> httpx.AsyncClient:
    """The pooled client of probes, forwards and drill calls; ``wrap`` puts the drills'
    black-hole (``services.control.drills.faults``) around its transport.

    A kept connection is reused only well inside a peer listener's idle time
    (``forward_exchange.idle_reuse_s``): httpx's default, 5 s, equals the listener's default,
    so a request could be written just as the peer closed the connection, and a write lost
    that way is ``outcome_unknown`` (httpx does not retry it)."""
    limits = httpx.Limits(
        max_connections=settings.forward_connections_max,
        max_keepalive_connections=settings.forward_connections_max,
        keepalive_expiry=idle_reuse_s(settings.header_timeout_s),
    )
    timeout_s = settings.max_deadline_ms / 1000  # each forward passes its own, shorter timeout
    tls = node_tls(settings)  # mutual TLS to peers' https listeners (services.cluster_tls)
    verify: ssl.SSLContext | bool = client_ssl_context(tls) if tls is not None else True
    transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(
        limits=limits, trust_env=False, verify=verify
    )
    if wrap is not None:  # a drill's black-hole (services.control.drills.faults)
        transport = wrap(transport)
    return httpx.AsyncClient(
        transport=transport,
        timeout=timeout_s,
        trust_env=False,
        # the region is checked against our certificate; the protocol against the peer's window
        headers={SOURCE_REGION_HEADER: settings.region, **PEER_PROTOCOL_HEADERS},
    )


def peer_prober(settings: NodeSettings, cluster: ClusterConfig, hole: BlackHole) -> OwnedPeerProber:
    """How the controller asks peers for their health: over connections of its own
    (``services.control.peer_probe``), to each region's peer listener, with mutual TLS where the node
    has certificates; a drill's black-hole is asked before each probe (``services.control.drills.faults``:
    the probe is the one call a drill's target still makes)."""
    tls = node_tls(settings)
    return HttpPeerProber(
        RegionNodes(cluster, settings.region).target_urls(),  # every node of every region
        timeout_s=settings.probe_timeout_s,
        peer_secret=cluster.peer_secret,
        ssl_context=client_ssl_context(tls) if tls is not None else None,
        source_region=settings.region,
        blocked=lambda target: hole.blocks(target_region(target), read_only=True),
    )


#: (the node's settings, its cluster, the drills' black-hole) -> its prober
PeerProberFactory = Callable[[NodeSettings, ClusterConfig, BlackHole], OwnedPeerProber]


def forward_exchange(settings: NodeSettings, hole: BlackHole) -> BatchExchange:
    """How forward batches travel to leaders: over connections of their own
    (``services.api.forward_exchange``), with mutual TLS where the node has certificates; a
    drill's black-hole drops them as it drops the node's other calls to its target."""
    tls = node_tls(settings)
    return StreamBatchExchange(
        ssl_context=client_ssl_context(tls) if tls is not None else None,
        blocked=lambda region: hole.blocks(region, read_only=False),
        idle_reuse_s=idle_reuse_s(settings.header_timeout_s),
        connect_timeout_s=settings.forward_connect_timeout_s,
    )


#: (the node's settings, the drills' black-hole) -> how its forward batches travel
ForwardExchangeFactory = Callable[[NodeSettings, BlackHole], BatchExchange]


@dataclass(frozen=True)
class NodeAdapters:
    """What a node's runtime takes from the world."""

    clock: Clock = field(default_factory=SystemClock)
    open_store: StoreOpener = open_replica_store
    peer_client: PeerClientFactory = peer_client
    peer_prober: PeerProberFactory = peer_prober
    forward_exchange: ForwardExchangeFactory = forward_exchange


def loss_readiness(
    settings: NodeSettings,
    controller: Controller,
    ops: OpsState,
    replica: ReplicaStore | None,
    sample_load: LoadSampler,
    clock: Clock,
) -> ReadinessMonitor:
    """The readiness loop's monitor (started with the controller's other loops)."""
    return ReadinessMonitor(
        controller=controller,
        ops=ops,
        replica=replica,
        sample_load=sample_load,
        clock=clock,
        region_append_capacity_per_s=settings.region_append_capacity_per_s,
        policy=ReadinessPolicy(
            drill_half_life_s=settings.readiness_drill_half_life_s,
            replay_target_s=settings.readiness_replay_target_s,
        ),
        interval_s=settings.readiness_interval_s,
    )


@asynccontextmanager
async def open_runtime(
    settings: NodeSettings, adapters: NodeAdapters | None = None
) -> AsyncIterator[NodeRuntime]:
    adapters = adapters or NodeAdapters()
    cluster = settings.load_cluster()
    clock = adapters.clock
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    ops = OpsState()  # drills, halt, audit: folded from the control shard by the controller
    hole = BlackHole(region=settings.region, ops=ops, clock=clock)
    peer_urls = {r.name: r.url_from.get(settings.region, r.url) for r in cluster.regions}
    peer_listener_urls = {r.name: r.peer_url_for(settings.region) for r in cluster.regions}
    # a drill's black-hole drops calls to a region's every node
    more_node_urls = {
        node_target(r.name, i): url
        for r in cluster.regions
        for i, url in enumerate([*r.node_urls(), *r.node_peer_urls(settings.region)])
        if url not in (peer_urls[r.name], peer_listener_urls[r.name])
    }
    async with AsyncExitStack() as stack:
        opened = await open_replica_stores(
            cluster, clock, stack, settings.region, adapters.open_store
        )
        instruments = ReplicaInstruments(replica_call_histogram())
        replicas = timed_replicas(black_holed_replicas(opened, hole), instruments, clock)
        leases = await open_own_leases(settings, cluster)
        for lease in leases:  # released last: once every leader of this node has stopped
            stack.push_async_callback(lease.close)
        node = build_log_node(settings, cluster, replicas, clock, rng)
        stack.push_async_callback(node.close)
        # runs first, once everything that could still lead or write has stopped
        stack.push_async_callback(node.publish_commits)
        load = LoadMeter(clock)
        node.add_listener(load)
        peers = await stack.enter_async_context(
            adapters.peer_client(
                settings,
                lambda inner: BlackHoleTransport(
                    inner,
                    hole,
                    _region_of(region_by_address(peer_urls, peer_listener_urls, more_node_urls)),
                ),
            )
        )
        exchange = adapters.forward_exchange(settings, hole)
        stack.push_async_callback(exchange.close)
        # Replay listens to the node before the controller leads anything (moves are seen).
        replay = await stack.enter_async_context(
            open_replay_service(
                region=settings.region,
                shard_count=cluster.shard_count,
                config=cluster.replay,
                node=node,
                clock=clock,
                rng=rng,
                peer_secret=cluster.peer_secret,  # the cache-salt key's fallback
            )
        )
        # The controller leads the shards the committed placement (at first the static one,
        # place_shards) assigns here, follows failovers and failbacks, and sets leader hints.
        prober = adapters.peer_prober(settings, cluster, hole)
        stack.push_async_callback(prober.close)
        controller = build_controller(settings, cluster, node, replicas, prober, clock, rng, leases)
        controller.record_listeners.append(ops.apply_entry)
        controller.control_excluded = ops.region_loss_targets
        drills = DrillDriver(
            controller=controller,
            node=node,
            ops=ops,
            replicas=replicas,
            peers=peers,
            peer_url=controller.nodes.peer_url_of(),  # the node leading each shard
            peer_secret=cluster.peer_secret,
            load=load,
            clock=clock,
            region_append_capacity_per_s=settings.region_append_capacity_per_s,
            replay_view=None if replay is None else replay.drill_view,
        )

        def sample_load() -> Awaitable[PlaneLoad]:
            return plane_load(
                peers,
                controller.nodes.peer_url_of(),
                [r.name for r in cluster.regions],
                settings.region,
                {PEER_AUTH_HEADER: cluster.peer_secret} if cluster.peer_secret else {},
                load,
                None if replay is None else replay.drill_view,
            )

        readiness = loss_readiness(
            settings, controller, ops, replicas.get(settings.region), sample_load, clock
        )
        practice = PracticeRunner(
            driver=drills,
            state=PracticeState(),
            clock=clock,
            failover_quiet_s=settings.practice_failover_quiet_s,
            seed=settings.practice_seed,
            sample_load=sample_load,
            burn_policy=BurnPolicy(
                slo_availability=settings.practice_slo_availability,
                window_s=settings.practice_burn_window_s,
                rate_max=settings.practice_burn_rate_max,
                min_appends=settings.practice_burn_min_appends,
            ),
        )
        controller.record_listeners.append(practice.state.apply_entry)
        await controller.start()
        stack.push_async_callback(controller.close)
        controller.supervisor.start("readiness", readiness.step, readiness.step_s)
        drills.start()
        stack.push_async_callback(drills.close)
        controller.supervisor.start("practice", practice.step, settings.practice_tick_s)
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
            drills,
            instruments,
            exchange,
            readiness,
            practice,
        )

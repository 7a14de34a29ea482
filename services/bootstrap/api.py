"""The REST app's state on top of a node runtime: the forwarder, the tenants, metrics watches,
admission, the console's origins and counters, and the replay routes' state. The app's lifespan
(``services.bootstrap.app``) opens it after the runtime and closes it before."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.api.admission import NodeAdmission
from services.api.append_outcomes import AppendOutcomes
from services.api.auth import Tenants
from services.api.context import ApiState, AppServices, set_app_services
from services.api.fast_lane import FastLane
from services.api.forward_batch import BatchConfig
from services.api.forwarding import Forwarder
from services.api.metrics import Metrics
from services.bootstrap.node import NodeRuntime
from services.bootstrap.replay import watch_replay
from services.config import NodeSettings
from services.console.access import ConsoleAccess
from services.control.audit_log import AuditPostLimiter
from services.control.key_admin import KeyAdmin
from services.control.node_metrics import (
    DrillVerdictRecorder,
    FailoverRecorder,
    NodeStateCollector,
    ReplayJobRecorder,
)
from services.control.readiness import ReadinessCollector
from services.control.region_nodes import PeerUrlOf, fixed_peer_urls
from services.tracing import NodeTracing


@asynccontextmanager
async def open_api(
    app: FastAPI,
    settings: NodeSettings,
    runtime: NodeRuntime,
    *,
    metrics: Metrics,
    tracing: NodeTracing | None,
    admission: NodeAdmission,
    console_access: ConsoleAccess,
    append_outcomes: AppendOutcomes,
    fast_lane: FastLane | None = None,
) -> AsyncIterator[AppServices]:
    forwarder = Forwarder(
        client=runtime.peers,
        peer_url=_leading_node_url(runtime, settings),
        clock=runtime.clock,
        rng=runtime.rng,
        metrics=metrics,
        retries_max=settings.forward_retries_max,
        backoff_s=settings.forward_backoff_s,
        peer_secret=runtime.cluster.peer_secret,
        source_region=settings.region,
        peer_reachable=_peer_reachable(runtime),
        refused=(
            runtime.controller.nodes.refused
            if runtime.controller is not None
            else lambda region, url: None
        ),
        node_lost=(
            runtime.controller.nodes.lost
            if runtime.controller is not None
            else lambda region, url: False
        ),
        connect_timeout_s=settings.forward_connect_timeout_s,
        batch_exchange=runtime.forward_exchange,
        inject_trace=tracing.inject if tracing is not None else None,
        # with tracing on, appends are forwarded one by one so each carries its own
        # trace context (a batch is one peer call for many traces)
        batch_limits=None
        if tracing is not None
        else BatchConfig(
            batch_max=settings.forward_batch_max,
            batches_in_flight_max=settings.forward_batches_in_flight_max,
            straggler_s=settings.forward_batch_straggler_s,
            batches_open_max=settings.forward_batches_open_max,
            queue_max=settings.forward_queue_max,
            retries_max=settings.forward_retries_max,
            backoff_s=settings.forward_backoff_s,
        ),
    )
    if runtime.replica_instruments is not None:
        runtime.replica_instruments.tracing = tracing
    api = ApiState(
        region=settings.region,
        settings=settings,
        cluster=runtime.cluster,
        log=runtime.log,
        tenants=Tenants(
            runtime.cluster.tenants,
            runtime.clock,
            runtime.cluster.replay.worker_key_regions(),
            # the control shard's keys, folded by the controller (none without a drill driver)
            keys=None if runtime.drills is None else runtime.drills.ops.keys,
        ),
        forwarder=forwarder,
        metrics=metrics,
        clock=runtime.clock,
        rng=runtime.rng,
        readiness=runtime.readiness,
        tracing=tracing,
        led_by_sibling=_led_by_sibling(runtime, settings),
    )
    if runtime.controller is not None:
        api.await_lead_here = runtime.controller.await_lead_here
        metrics.watch_loops(runtime.controller.supervisor)
        metrics.watch_replicas(runtime.controller.node.identity)
    _watch_node(metrics, runtime)
    services = AppServices(
        api=api,
        controller=runtime.controller,
        drills=runtime.drills,
        key_admin=None
        if runtime.drills is None
        else KeyAdmin(runtime.drills, runtime.cluster.tenants, runtime.clock),
        audit_limiter=AuditPostLimiter(runtime.clock, metrics.registry),
        replay=runtime.replay,
        loss_readiness=runtime.loss_readiness,
        practice=runtime.practice,
    )
    set_app_services(app, services)
    watch_replay(metrics.registry, runtime.replay)
    console_access.open(runtime.cluster, settings)
    append_outcomes.open(runtime.clock)
    if runtime.drills is not None:
        runtime.drills.load.entry_outcomes = append_outcomes.succeeded_and_errors
    admission.open(
        settings=settings,
        cluster=runtime.cluster,
        tenants=api.tenants,
        clock=runtime.clock,
    )
    if fast_lane is not None:
        fast_lane.open(api)
    try:
        yield services
    finally:
        if fast_lane is not None:
            fast_lane.close()
        await forwarder.close()
        await admission.close()


def _led_by_sibling(runtime: NodeRuntime, settings: NodeSettings) -> Callable[[int], bool]:
    controller = runtime.controller
    if controller is None:
        return lambda shard: False
    return lambda shard: (
        not controller.slots.leads(shard)
        and controller.nodes.leading_node(settings.region, shard) != settings.node_index
    )


def _leading_node_url(runtime: NodeRuntime, settings: NodeSettings) -> PeerUrlOf:
    """Where forwards of each shard to each region go: the peer listener of the region's node
    that leads it, as the controller last heard (``services.control.region_nodes``)."""
    controller = runtime.controller
    if controller is None:
        return fixed_peer_urls(
            {r.name: r.peer_url_for(settings.region) for r in runtime.cluster.regions}
        )
    return controller.nodes.peer_url_of()


def _peer_reachable(runtime: NodeRuntime) -> Callable[[str], bool] | None:
    controller = runtime.controller
    if controller is None:
        return None
    return lambda region: (
        not controller.membership.suspects_region(region, runtime.clock.monotonic())
    )


def _watch_node(metrics: Metrics, runtime: NodeRuntime) -> None:
    """Export the node's leadership, regions, replicas, placement, failovers, drills, replica
    call times and replay job times (``services.control.node_metrics``) in the app's registry."""
    if runtime.replica_instruments is not None:
        metrics.registry.register(runtime.replica_instruments.histogram)
    if runtime.replay is not None:
        runtime.replay.result_listeners.append(ReplayJobRecorder(metrics.registry))
    if runtime.loss_readiness is not None:
        metrics.registry.register(ReadinessCollector(runtime.loss_readiness))
    controller = runtime.controller
    if controller is None:
        return
    ops = runtime.drills.ops if runtime.drills is not None else None
    metrics.registry.register(NodeStateCollector(controller, ops, runtime.clock))
    controller.node.add_listener(FailoverRecorder(controller, runtime.clock, metrics.registry))
    if ops is not None:
        recorder = DrillVerdictRecorder(ops, metrics.registry, runtime.clock.wall_ms())
        controller.record_listeners.append(recorder)

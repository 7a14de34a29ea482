"""Building the replay service of one node (called from ``services.bootstrap.node``) and
exporting its metrics in the API app's registry (from ``services.bootstrap.api``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

from eventlog.clock import Clock
from eventlog.node import LogNode
from replay.bus.memory import InProcessJobBus
from replay.bus.port import JobBus
from replay.capacity import CapacityGate
from replay.engines.base import InferenceEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.worker import ReplayWorker, WorkerConfig
from services.replay.config import ReplayConfig
from services.replay.moved import MovedConversationLister, MovedListConfig
from services.replay.region_capacity import RegionCapacity
from services.replay.service import ReplayService, ReplayServiceConfig
from services.replay.transcripts import LogTranscriptSource

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


def _bus(region: str, config: ReplayConfig) -> tuple[JobBus, str]:
    if config.kafka_bootstrap_servers:
        from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaSecurity

        security = KafkaSecurity(
            protocol=config.kafka_security_protocol,
            ssl_cafile=config.kafka_ssl_cafile,
            ssl_certfile=config.kafka_ssl_certfile,
            ssl_keyfile=config.kafka_ssl_keyfile,
            sasl_mechanism=config.kafka_sasl_mechanism,
            sasl_username=config.kafka_sasl_username,
            sasl_password=config.kafka_sasl_password,
        )
        settings = KafkaBusConfig(
            config.kafka_bootstrap_servers,
            bus_secrets=config.bus_keys(),
            security=security,
            client_id=f"convplane-node-{region}",
        )
        return KafkaJobBus(settings, regions=[region]), "kafka"
    return InProcessJobBus(jobs_max_per_region=10_000, results_max=10_000), "embedded"


def build_replay_service(
    *,
    region: str,
    shard_count: int,
    config: ReplayConfig,
    node: LogNode,
    clock: Clock,
    rng: random.Random,
    engines: Mapping[str, InferenceEngine],
    bus: JobBus,
    mode: str,
    limits: ReplayServiceConfig | None = None,
    peer_secret: str | None = None,
) -> ReplayService:
    """The service over given engines and bus (tests pass fakes; ``open_replay_service`` real
    ones). In embedded mode each engine gets an in-process worker gated by its own spare."""
    configured = dict(config.region_engines(region))
    capacity = RegionCapacity(
        [(e, configured[i].capacity_tokens_per_s) for i, e in engines.items()],
        config,
        clock,
        rng,
    )
    lister = MovedConversationLister(
        node,
        clock,
        MovedListConfig(config.replay_window_s, config.conversations_per_shard_max),
    )
    service_limits = limits or ReplayServiceConfig()
    workers = []
    if mode == "embedded":
        transcripts = LogTranscriptSource(node)
        for engine_id, engine in engines.items():
            workers.append(
                ReplayWorker(
                    f"{region}-w-{engine_id}",
                    region,
                    bus,
                    engine,
                    transcripts,
                    CapacityGate(capacity.engine_controllers[engine_id]),
                    clock,
                    random.Random(rng.getrandbits(64)),
                    WorkerConfig(
                        concurrency=config.worker_concurrency,
                        drain_timeout_s=service_limits.worker_drain_timeout_s,
                        priority_declared=configured[engine_id].priority_scheduling_declared,
                    ),
                    cache_salt_key=config.salt_key(peer_secret),
                )
            )
    return ReplayService(
        region=region,
        shard_count=shard_count,
        config=config,
        lister=lister,
        bus=bus,
        capacity=capacity,
        clock=clock,
        rng=rng,
        workers=workers,
        engine_urls={i: configured[i].url for i in engines},
        mode=mode,
        limits=service_limits,
        read_grant_key=config.read_grant_key(peer_secret),
    )


@asynccontextmanager
async def open_replay_service(
    *,
    region: str,
    shard_count: int,
    config: ReplayConfig,
    node: LogNode,
    clock: Clock,
    rng: random.Random,
    peer_secret: str | None = None,
) -> AsyncIterator[ReplayService]:
    """Engines (vLLM HTTP adapters, also for the simulator), bus, workers; listens to ``node``.
    Closes workers, loops, bus and engines on exit."""
    async with AsyncExitStack() as stack:
        engines: dict[str, InferenceEngine] = {}
        for engine_id, engine_config in config.region_engines(region):
            engine = VllmHttpEngine(engine_id, engine_config.url, engine_config.model_revision)
            stack.push_async_callback(engine.aclose)
            engines[engine_id] = engine
        bus, mode = _bus(region, config)
        service = build_replay_service(
            region=region,
            shard_count=shard_count,
            config=config,
            node=node,
            clock=clock,
            rng=rng,
            engines=engines,
            bus=bus,
            mode=mode,
            peer_secret=peer_secret,
        )
        node.add_listener(service)
        service.start()
        stack.push_async_callback(service.close)
        yield service


def watch_replay(registry: CollectorRegistry, service: ReplayService | None) -> None:
    """Export the replay service's metrics in the app's registry."""
    from services.replay.metrics import ReplayCollector

    if service is not None:
        registry.register(ReplayCollector(service))

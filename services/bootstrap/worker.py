"""A replay worker process (``convplane worker``): the vLLM HTTP engine, a ``CapacityController``
fed by a ``CapacityPoller`` from the engine's own metrics (behind ``CapacityGate``), the Kafka job
bus signed with its own region's secret only, and the region's REST API as transcript source.
SIGINT/SIGTERM stop it gracefully: running jobs get the drain timeout, then are abandoned
uncommitted (redelivered to another worker)."""

from __future__ import annotations

import asyncio
import random
import signal

import httpx

from eventlog.clock import SystemClock
from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaSecurity
from replay.capacity import CapacityConfig, CapacityController, CapacityGate, CapacityPoller
from replay.engines.vllm_http import VllmHttpEngine
from replay.transcripts_http import HttpTranscriptSource
from replay.worker import ReplayWorker, WorkerConfig


async def run_worker(
    *,
    worker_id: str,
    region: str,
    engine_url: str,
    model_revision: str,
    bootstrap_servers: str,
    region_url: str,
    api_key: str,
    capacity_tokens_per_s: float,
    concurrency: int,
    cache_salt_key: bytes,
    bus_secret: bytes,
    security: KafkaSecurity,
    session_timeout_s: float = 10.0,
    priority_declared: bool = False,
) -> dict[str, int]:
    """Wire a worker (its graph is the module docstring's), run it until SIGINT or SIGTERM,
    and return its counts."""
    clock, rng = SystemClock(), random.Random()
    engine = VllmHttpEngine(worker_id, engine_url, model_revision)
    controller = CapacityController(
        CapacityConfig(capacity_tokens_per_s, max_concurrent_replays=concurrency), clock
    )
    poller = CapacityPoller(engine, controller, clock, rng)
    bus_settings = KafkaBusConfig(
        bootstrap_servers,
        bus_secrets={region: bus_secret},  # its own region's only: it cannot sign for others
        security=security,
        client_id=worker_id,
        session_timeout_s=session_timeout_s,
        heartbeat_interval_s=min(3.0, session_timeout_s / 3),  # Kafka's advice: <= 1/3
    )
    bus = KafkaJobBus(bus_settings, regions=[region])
    async with (
        httpx.AsyncClient(base_url=region_url, timeout=httpx.Timeout(10.0)) as region_client,
        bus,
    ):
        worker = ReplayWorker(
            worker_id,
            region,
            bus,
            engine,
            HttpTranscriptSource(region_client, api_key),
            CapacityGate(controller),
            clock,
            rng,
            WorkerConfig(concurrency=concurrency, priority_declared=priority_declared),
            cache_salt_key=cache_salt_key,
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, worker.request_stop)
        poll_task = asyncio.create_task(poller.run())
        try:
            await worker.run()
        finally:
            poll_task.cancel()
            await asyncio.gather(poll_task, return_exceptions=True)
            await engine.aclose()
    return dict(worker.counts)

"""Helpers of the Kafka replay tests: child processes (a simulated engine's server, workers) that
are killed at the end, waiting on a condition while they live, and a reader of the results
topic."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from replay.bus.kafka import KafkaBusConfig, KafkaJobBus
from replay.bus.port import jobs_topic, worker_group
from replay.engines.prometheus_text import parse_engine_metrics
from replay.model import EngineMetrics, ReplayResult
from services.local.host import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
CONVPLANE = [sys.executable, "-c", "from services.cli.main import main; main()"]
MODEL = "sim-model@rev1"
TENANT = "t1"
GIVE_UP_S = 120.0  # hang guard for process starts, group joins and results; not a speed claim
POLL_S = 0.1


@dataclass
class Child:
    """A ``convplane`` subprocess; its output goes to a file (read on failure)."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def spawn(name: str, args: Sequence[str], log_dir: Path) -> Child:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*CONVPLANE, *args], env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    return Child(name, process, log_path)


@contextlib.asynccontextmanager
async def children() -> AsyncIterator[list[Child]]:
    """Processes started in the block; all stopped (SIGTERM, then SIGKILL) when it ends."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            await asyncio.to_thread(child.stop)


async def until(what: str, check: Callable[[], Any], children_: Sequence[Child] = ()) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value; fail loudly if a child
    process died or ``GIVE_UP_S`` passed (a hang guard, not an assertion about speed)."""
    give_up_at = time.monotonic() + GIVE_UP_S
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        for child in children_:
            if not child.alive():
                pytest.fail(f"{child.name} exited ({child.process.returncode}):\n{child.output()}")
        if time.monotonic() > give_up_at:
            pytest.fail(f"gave up after {GIVE_UP_S}s waiting for: {what}")
        await asyncio.sleep(POLL_S)


@dataclass
class SimEngineProc:
    child: Child
    url: str

    async def metrics(self, client: httpx.AsyncClient) -> EngineMetrics:
        response = await client.get(self.url + "/metrics", timeout=5.0)
        response.raise_for_status()
        return parse_engine_metrics(response.text)


async def start_sim_engine(
    name: str,
    started: list[Child],
    log_dir: Path,
    *,
    prefill_tokens_per_s: float,
    chunk_tokens: int,
) -> SimEngineProc:
    port = free_port()
    child = spawn(name, ["sim-engine", "serve", "--port", str(port), "--model", MODEL,
                         "--prefill-tokens-per-s", str(prefill_tokens_per_s),
                         "--chunk-tokens", str(chunk_tokens), "--engine-id", name],
                  log_dir)  # fmt: skip
    started.append(child)
    engine = SimEngineProc(child, f"http://127.0.0.1:{port}")

    async def healthy() -> bool:
        async with httpx.AsyncClient() as client:
            try:
                return (await client.get(engine.url + "/health", timeout=2.0)).status_code == 200
            except httpx.HTTPError:
                return False

    await until(f"{name} serves /health", healthy, [child])
    return engine


class ResultLog:
    """Every result of one region, read from the results topic from its start."""

    def __init__(self, bus: KafkaJobBus, region: str) -> None:
        self._bus = bus
        self._region = region
        self._stop = asyncio.Event()
        self.results: list[ReplayResult] = []

    async def run(self) -> None:
        async with self._bus.result_stream() as stream:
            while not self._stop.is_set():
                result = await stream.next_result(timeout_s=0.2)
                if result is not None and result.region == self._region:
                    self.results.append(result)

    def stop(self) -> None:
        self._stop.set()

    def of(self, job_id: str, worker_id: str | None = None) -> list[ReplayResult]:
        return [
            r
            for r in self.results
            if r.job_id == job_id and (worker_id is None or r.worker_id == worker_id)
        ]


@contextlib.asynccontextmanager
async def result_log(bus: KafkaJobBus, region: str) -> AsyncIterator[ResultLog]:
    log = ResultLog(bus, region)
    task = asyncio.create_task(log.run())
    try:
        yield log
    finally:
        log.stop()
        await asyncio.wait_for(task, 30)


async def committed_offset(settings: KafkaBusConfig, region: str) -> int | None:
    """The group's committed offset of partition 0, read from the broker (not the consumer)."""
    reader = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=worker_group(region),
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        offset = await reader.committed(TopicPartition(jobs_topic(region), 0))
        return None if offset is None else int(offset)
    finally:
        await reader.stop()

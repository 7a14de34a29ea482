"""The worker's engine self-check against the simulated engine's vLLM-shaped HTTP face (ASGI,
no network): revision, priority scheduling, prefix caching, cached tokens reported; a worker
whose engine fails it takes no job and says why."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from eventlog.clock import LoopClock
from replay.bus import InProcessJobBus
from replay.chat import ChatPrompt
from replay.engines.base import ModelRevisionMismatch
from replay.engines.sim_core import SchedulingPolicy, SimEngineConfig
from replay.engines.sim_server import create_app
from replay.engines.simulated import SimulatedEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import PrefillRequest
from replay.worker import ReplayWorker, WorkerConfig
from tests.unit.fakes_replay import FakeGate, FakeTranscripts

MODEL = "llama@r1"


@asynccontextmanager
async def engine_over_http(
    *,
    policy: SchedulingPolicy = "priority",
    details: bool = True,
    cache_tokens: int = 100_000,
    revision: str = MODEL,
) -> AsyncIterator[VllmHttpEngine]:
    config = SimEngineConfig(
        prefill_tokens_per_s=5_000_000.0, cache_tokens=cache_tokens,
        scheduling_policy=policy, prompt_tokens_details=details,
    )  # fmt: skip
    simulated = SimulatedEngine("sim-0", MODEL, config, LoopClock())
    app = create_app(simulated)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client,
    ):
        yield VllmHttpEngine("sim-0", "http://sim", revision, client=client)


async def test_a_properly_started_engine_passes() -> None:
    async with engine_over_http() as engine:
        assert await engine.self_check(replay_priority=100) == []


@pytest.mark.parametrize(
    ("settings", "code"),
    [
        ({"policy": "fcfs"}, "priority_scheduling_off"),
        ({"details": False}, "prompt_tokens_details_off"),
        ({"cache_tokens": 0}, "prefix_caching_off"),
        ({"revision": "llama@r2"}, "model_revision_mismatch"),
    ],
)
async def test_each_missing_flag_is_named(settings: dict[str, object], code: str) -> None:
    async with engine_over_http(**settings) as engine:  # type: ignore[arg-type]
        problems = await engine.self_check(replay_priority=100)
    assert [p.code for p in problems] == [code]
    assert problems[0].message


async def test_the_simulator_refuses_an_empty_salt_with_vllms_error_body() -> None:
    async with engine_over_http() as engine:
        client = engine._client  # the ASGI client the adapter was given
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "cache_salt": ""}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
        unknown = await client.post("/v1/chat/completions", json={**body, "model": "x@1",
                                                                   "cache_salt": "s"})  # fmt: skip
        assert unknown.status_code == 404
        card = (await client.get("/v1/models")).json()["data"][0]
        assert card["id"] == MODEL and card["object"] == "model" and "max_model_len" in card


async def test_a_worker_on_an_unfit_engine_takes_no_job_and_says_why() -> None:
    async with (
        engine_over_http(policy="fcfs") as engine,
        InProcessJobBus(jobs_max_per_region=10) as bus,
    ):
        settings = WorkerConfig(recheck_s=0.01, idle_poll_s=0.01)
        worker = ReplayWorker(
            "w1", "eu", bus, engine, FakeTranscripts(), FakeGate(), LoopClock(),
            random.Random(1), settings, cache_salt_key=bytes(32),
        )  # fmt: skip
        task = asyncio.create_task(worker.run())
        for _ in range(1000):  # bounded: the test fails, never hangs, if the check never fails
            if worker.counts["engine_check_failed"] >= 2:
                break
            await asyncio.sleep(0.01)
        assert worker.counts["engine_check_failed"] >= 2
        assert worker.consumer is None  # never joined the group
        assert worker.engine_problems is not None
        assert [p.code for p in worker.engine_problems] == ["priority_scheduling_off"]
        worker.request_stop()
        await asyncio.wait_for(task, 5.0)


async def test_a_404_from_the_server_is_a_model_revision_mismatch() -> None:
    """The adapter is configured for a revision the server does not serve: vLLM answers 404."""
    async with engine_over_http(revision="llama@r2") as engine:
        request = PrefillRequest("llama@r2", ChatPrompt(({"role": "user", "content": "hi"},)),
                                 "salt", 100, "r1")  # fmt: skip
        with pytest.raises(ModelRevisionMismatch):
            await engine.prefill(request)

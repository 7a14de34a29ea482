"""The vLLM HTTP adapter against the simulated engine's HTTP server, over real loopback HTTP
(uvicorn on a free port) and over an in-process ASGI transport for the error paths."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from eventlog.clock import SystemClock
from replay.chat import ChatPrompt
from replay.engines.base import EngineRejectedRequest, EngineUnavailable
from replay.engines.sim_core import SimEngineConfig
from replay.engines.sim_server import create_app
from replay.engines.simulated import SimulatedEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import PrefillRequest
from services.local.host import free_port

MODEL = "sim-model@rev1"
MESSAGES = ChatPrompt(
    (
        {"role": "system", "content": "you are a helpful assistant " * 20},
        {"role": "user", "content": " ".join(f"word{i}" for i in range(600))},
    )
)


def _simulated() -> SimulatedEngine:
    # slow enough that the priority probe's queue (10 prompts of 1,024-4,096 tokens) takes
    # its own time to drain: at 2,000,000 tokens/s it drained in milliseconds, and on a
    # loaded machine the probe's timing judged a live request as having waited behind it
    config = SimEngineConfig(prefill_tokens_per_s=200_000.0, cache_tokens=1_000_000)
    return SimulatedEngine("sim-0", MODEL, config, SystemClock())


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(_simulated()), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:  # noqa: ASYNC110 (uvicorn exposes only a flag)
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_adapter_prefills_and_reads_metrics_over_loopback(base_url: str) -> None:
    engine = VllmHttpEngine("sim-0", base_url, MODEL)
    try:
        fitness = await engine.self_check(replay_priority=100, priority_declared=True)
        assert fitness.fit and {c.verdict for c in fitness.checks} == {"passed"}, fitness
        before = await engine.metrics()  # counts the self-check's probe requests
        probes = before.generation_tokens_total
        assert probes >= 2
        first = await engine.prefill(PrefillRequest(MODEL, MESSAGES, "tenant-a", 100, "r1"))
        second = await engine.prefill(PrefillRequest(MODEL, MESSAGES, "tenant-a", 0, "r2"))
        other = await engine.prefill(PrefillRequest(MODEL, MESSAGES, "tenant-b", 0, "r3"))
        assert first.prompt_tokens > 600
        assert first.cached_prompt_tokens == 0
        assert second.cached_prompt_tokens == (first.prompt_tokens // 16) * 16
        assert other.cached_prompt_tokens == 0
        metrics = await engine.metrics()
        assert metrics.prompt_tokens_total - before.prompt_tokens_total == 3 * first.prompt_tokens
        assert before.prefix_cache_hits_total is not None
        hits = metrics.prefix_cache_hits_total
        assert (
            hits is not None
            and hits - before.prefix_cache_hits_total == second.cached_prompt_tokens
        )
        assert metrics.generation_tokens_total == probes + 3
        assert metrics.num_requests_running == metrics.num_requests_waiting == 0
        async with httpx.AsyncClient(base_url=base_url) as raw:
            assert (await raw.get("/health")).status_code == 200
    finally:
        await engine.aclose()


async def test_wrong_revision_is_detected() -> None:
    simulated = _simulated()
    transport = httpx.ASGITransport(app=create_app(simulated))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        engine = VllmHttpEngine("sim-0", "http://sim", "other@rev9", client=client)
        fitness = await engine.self_check(replay_priority=100)
        assert [p.code for p in fitness.problems] == ["serves_revision"]
        # the adapter refuses locally; the server refuses too (vLLM answers 404 for a model
        # it does not serve): the adapter translates it to a typed rejection
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "other@rev9", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 404
        bad = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
        assert bad.status_code == 400
    await simulated.aclose()


async def test_http_errors_are_translated_once() -> None:
    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            sent.append(json.loads(request.content))
        if request.url.path == "/metrics":
            return httpx.Response(503, text="overloaded", headers={"Retry-After": "2"})
        return httpx.Response(400, json={"object": "error", "message": "too long"})

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(handler), base_url="http://vllm"
    ) as client:
        engine = VllmHttpEngine("v-0", "http://vllm", MODEL, client=client)
        with pytest.raises(EngineUnavailable) as unavailable:
            await engine.metrics()
        assert unavailable.value.retry_after_s == 2.0
        with pytest.raises(EngineRejectedRequest):
            await engine.prefill(PrefillRequest(MODEL, MESSAGES, "t", 100, "r"))
    assert sent[0]["max_completion_tokens"] == 1 and sent[0]["temperature"] == 0
    assert sent[0]["priority"] == 100 and sent[0]["cache_salt"] == "t"
    assert sent[0]["model"] == MODEL


async def test_unreachable_engine_is_unavailable() -> None:
    port = free_port()  # nothing listens there
    engine = VllmHttpEngine("v-0", f"http://127.0.0.1:{port}", MODEL, metrics_timeout_s=2.0)
    try:
        with pytest.raises(EngineUnavailable):
            await engine.metrics()
    finally:
        await engine.aclose()

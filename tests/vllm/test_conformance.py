"""The simulated engine held to a real vLLM on the same requests, as ``tests/replica_conformance``
holds the replicas to PostgreSQL: the same status codes for what replay and the live path send
(and for what vLLM refuses), the same usage fields (cached tokens included), and the same
counter movements on ``/metrics``. The simulator is configured with the server's flags
(``SimEngineConfig``); token counts differ (another tokenizer, 16- vs 32-token blocks), so
each engine is held to the same relations of its own counts. The replay self-check, the
priority probe's timing included, reaches the same verdicts on both."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from eventlog.clock import SystemClock
from replay.engines.prometheus_text import parse_engine_metrics
from replay.engines.sim_core import BLOCK_TOKENS as SIM_BLOCK_TOKENS
from replay.engines.sim_core import SimEngineConfig
from replay.engines.sim_server import create_app
from replay.engines.simulated import SimulatedEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import EngineMetrics
from tests import tool_conversation
from tests.vllm.servers import (
    BLOCK_TOKENS,
    MODEL_REVISION,
    VllmServer,
    common_words,
    decisive_check,
)

COUNTERS_SETTLE_S = 10.0  # vLLM records a request's stats just after answering it
WHOLE_BLOCK_TRIES = 256  # prompt lengths tried to find one of whole blocks

WELL = SimEngineConfig(max_model_len=2048)
BADLY = SimEngineConfig(
    max_model_len=2048, trust_request_chat_template=False, enable_auto_tool_choice=False,
    prompt_tokens_details=False, log_stats=False, cache_tokens=0, scheduling_policy="fcfs",
)  # fmt: skip
#: the CPU server's pace: 2,048-token scheduler steps (its max_num_batched_tokens), about
#: 30,000 prompt tokens a second
PREFILL_TOKENS_PER_S, STEP_TOKENS = 30_000.0, 2048


@asynccontextmanager
async def simulator(config: SimEngineConfig) -> AsyncIterator[httpx.AsyncClient]:
    engine = SimulatedEngine("sim", MODEL_REVISION, config, SystemClock())
    app = create_app(engine)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client,
    ):
        yield client


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_REVISION, "messages": [{"role": "user", "content": "hello there"}],
            "max_completion_tokens": 1, "temperature": 0, **fields}  # fmt: skip


TOOL_PROMPT = {"messages": tool_conversation.messages("conf", turn_words=20),
               "tools": tool_conversation.TOOLS}  # fmt: skip
REQUESTS: dict[str, dict[str, Any]] = {
    "plain": body(),
    "replay_with_tools": body(**TOOL_PROMPT, tool_choice="none", priority=100),
    "live_with_tools": body(**TOOL_PROMPT),  # tool_choice defaults to auto
    "chat_template": body(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"),
    "priority": body(priority=100),
    "cache_salt": body(cache_salt="tenant-a"),
    "empty_cache_salt": body(cache_salt=""),
    "unknown_model": body(model="nobody@r0"),
    "no_messages": body(messages=[]),
    "over_max_model_len": body(messages=[{"role": "user", "content": "word " * 3000}]),
}
STATUS_WELL = {"empty_cache_salt": 400, "unknown_model": 404, "no_messages": 400,
               "over_max_model_len": 400}  # fmt: skip
STATUS_BADLY = {**STATUS_WELL, "live_with_tools": 400, "chat_template": 400}


@pytest.mark.parametrize(("config", "expected"), [("well", STATUS_WELL), ("badly", STATUS_BADLY)])
async def test_the_same_requests_get_the_same_status_codes(
    request: pytest.FixtureRequest, config: str, expected: Mapping[str, int]
) -> None:
    server: VllmServer = request.getfixturevalue(f"{config}_configured")
    async with (
        simulator(WELL if config == "well" else BADLY) as sim,
        httpx.AsyncClient(base_url=server.url, timeout=60.0) as real,
    ):
        for name, sent in REQUESTS.items():
            real_status = (await real.post("/v1/chat/completions", json=sent)).status_code
            sim_response = await sim.post("/v1/chat/completions", json=sent)
            want = expected.get(name, 200)
            assert (name, real_status) == (name, want)
            assert (name, sim_response.status_code) == (name, want), sim_response.text
            if want >= 400:
                assert set(sim_response.json()["error"]) >= {"message", "type", "code"}


async def test_usage_and_counters_move_alike(well_configured: VllmServer) -> None:
    async with (
        simulator(WELL) as sim,
        httpx.AsyncClient(base_url=well_configured.url, timeout=60.0) as real,
    ):
        for client, block_tokens in ((real, BLOCK_TOKENS), (sim, SIM_BLOCK_TOKENS)):
            await _usage_and_counters(client, block_tokens)


async def _usage_and_counters(client: httpx.AsyncClient, block_tokens: int) -> None:
    sent = await _whole_blocks_prompt(client, block_tokens)
    before = await _metrics(client)
    usages = []
    for _ in range(2):
        response = await client.post("/v1/chat/completions", json=sent)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    first, second = usages
    prompt = first["prompt_tokens"]
    assert second["prompt_tokens"] == prompt > 2 * block_tokens
    assert first["completion_tokens"] == second["completion_tokens"] == 1
    assert first["total_tokens"] == prompt + 1
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # every full block but the one holding the last prompt token (it is always recomputed)
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == (prompt - 1) // block_tokens * block_tokens
    after = await _settled_metrics(client, before.prompt_tokens_total + 2 * prompt)
    assert after.prompt_tokens_total - before.prompt_tokens_total == 2 * prompt
    assert after.generation_tokens_total - before.generation_tokens_total == 2
    assert _delta(after.computed_prompt_tokens_total, before.computed_prompt_tokens_total) == (
        2 * prompt - cached
    )
    assert _delta(after.prefix_cache_hits_total, before.prefix_cache_hits_total) == cached
    assert _delta(after.prefix_cache_queries_total, before.prefix_cache_queries_total) == 2 * prompt
    assert after.num_requests_running == after.num_requests_waiting == 0


async def _whole_blocks_prompt(client: httpx.AsyncClient, block_tokens: int) -> dict[str, Any]:
    """A request whose prompt is whole blocks (where "the last token is recomputed" and "the
    last block is recomputed" differ), under a fresh salt; found by trying lengths."""
    for words in range(100, 100 + WHOLE_BLOCK_TRIES):
        text = common_words(words)
        sent = body(messages=[{"role": "user", "content": text}], cache_salt=secrets.token_hex(16))
        response = await client.post("/v1/chat/completions", json=sent)
        assert response.status_code == 200, response.text
        if response.json()["usage"]["prompt_tokens"] % block_tokens == 0:
            return {**sent, "cache_salt": secrets.token_hex(16)}
    raise AssertionError(f"no prompt of whole {block_tokens}-token blocks in {WHOLE_BLOCK_TRIES}")


async def _metrics(client: httpx.AsyncClient) -> EngineMetrics:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return parse_engine_metrics(response.text)


async def _settled_metrics(client: httpx.AsyncClient, prompt_tokens_total: float) -> EngineMetrics:
    async with asyncio.timeout(COUNTERS_SETTLE_S):
        while True:
            metrics = await _metrics(client)
            if metrics.prompt_tokens_total >= prompt_tokens_total and not (
                metrics.num_requests_running or metrics.num_requests_waiting
            ):
                return metrics
            await asyncio.sleep(0.1)


def _delta(after: float | None, before: float | None) -> float:
    assert after is not None and before is not None, "the series is exported"
    return after - before


@pytest.mark.parametrize("configured", ["well", "badly"])
async def test_the_self_check_reaches_the_same_verdicts_priority_probe_included(
    configured: str, request: pytest.FixtureRequest
) -> None:
    server: VllmServer = request.getfixturevalue(f"{configured}_configured")
    config = dataclasses.replace(
        WELL if configured == "well" else BADLY,
        prefill_tokens_per_s=PREFILL_TOKENS_PER_S,
        chunk_tokens=STEP_TOKENS,
    )
    real = await decisive_check(server.url)
    async with simulator(config) as client:
        sim_engine = VllmHttpEngine("sim", "http://sim", MODEL_REVISION, client=client)
        simulated = await sim_engine.self_check(replay_priority=100)
    assert simulated.verdicts() == real.verdicts(), (simulated.reasons(), real.reasons())
    expected = "passed" if configured == "well" else "failed"
    assert real.verdict("priority_scheduling") == expected, real.reasons()

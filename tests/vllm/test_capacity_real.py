"""The capacity arithmetic (``replay.capacity``) on a real vLLM's counters while live and replay
requests run on it together: the live rate is the engine's computed prompt tokens
(``prompt_tokens_by_source{local_compute}``) less replay's own, which the controller learns
from each replay's usage. Time is a manual clock (the scrapes' instants are chosen), so the
rates are exact; only the counters come from the server."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from replay.capacity import CapacityConfig, CapacityController, Grant
from replay.chat import ChatPrompt
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import EngineMetrics, PrefillOutcome, PrefillRequest
from tests import tool_conversation
from tests.unit.clocks import ManualClock
from tests.vllm.servers import MODEL_REVISION, VllmServer, common_words

CAPACITY_TOKENS_PER_S = 20_000.0
HEADROOM = 0.1
SCRAPE_GAP_S = 10.0  # virtual seconds between the two scrapes
COUNTERS_SETTLE_S = 10.0
LIVE_REQUESTS = 4
REPLAYS = 3
REPLAY_GRANT_TOKENS = 400


def _prompt(offset: int, words: int, **settings: Any) -> ChatPrompt:
    return ChatPrompt(({"role": "user", "content": common_words(words, offset)},), **settings)


async def test_live_rate_is_the_engines_computed_tokens_less_replays(
    well_configured: VllmServer,
) -> None:
    clock = ManualClock(1000.0)
    config = CapacityConfig(CAPACITY_TOKENS_PER_S, headroom=HEADROOM,
                            max_concurrent_replays=REPLAYS)  # fmt: skip
    controller = CapacityController(config, clock)
    engine = VllmHttpEngine("well", well_configured.url, MODEL_REVISION)
    try:
        before = await engine.metrics()
        controller.observe(before)
        clock.now_s += 1.0  # an idle second: the spare bucket fills for the replays' grants
        controller.observe(before)
        salt = secrets.token_hex(16)
        live = [
            PrefillRequest(MODEL_REVISION, _prompt(i, 200 + 40 * i), salt, 0, f"l{i}")
            for i in range(LIVE_REQUESTS)
        ]
        replays = [
            PrefillRequest(MODEL_REVISION, _prompt(3 + i, 300 + 50 * i,
                                                   tools=tuple(tool_conversation.TOOLS)),
                           salt, 100, f"r{i}")
            for i in range(REPLAYS)
        ]  # fmt: skip
        for _ in replays:
            assert controller.try_acquire(REPLAY_GRANT_TOKENS, "t1") is Grant.GRANTED
        outcomes = await asyncio.gather(*(engine.prefill(r) for r in [*live, *replays]))
        live_outcomes, replay_outcomes = outcomes[:LIVE_REQUESTS], outcomes[LIVE_REQUESTS:]
        for outcome in replay_outcomes:
            controller.release(outcome.prompt_tokens - outcome.cached_prompt_tokens)
        after = await _settled(engine, before, outcomes)
    finally:
        await engine.aclose()
    clock.now_s += SCRAPE_GAP_S
    controller.observe(after)

    computed = _computed(after) - _computed(before)
    assert computed == sum(o.prompt_tokens - o.cached_prompt_tokens for o in outcomes)
    live_computed = sum(o.prompt_tokens - o.cached_prompt_tokens for o in live_outcomes)
    snapshot = controller.snapshot()
    assert snapshot.live_tokens_per_s == pytest.approx(live_computed / SCRAPE_GAP_S)
    usable = CAPACITY_TOKENS_PER_S * (1 - HEADROOM)
    assert snapshot.spare_tokens_per_s == pytest.approx(usable - live_computed / SCRAPE_GAP_S)
    assert snapshot.in_flight == 0


def _computed(metrics: EngineMetrics) -> float:
    assert metrics.computed_prompt_tokens_total is not None, "vLLM exports local_compute"
    return metrics.computed_prompt_tokens_total


async def _settled(
    engine: VllmHttpEngine, before: EngineMetrics, outcomes: list[PrefillOutcome]
) -> EngineMetrics:
    """The scrape after every request is counted (vLLM counts just after answering)."""
    expected = before.prompt_tokens_total + sum(o.prompt_tokens for o in outcomes)
    async with asyncio.timeout(COUNTERS_SETTLE_S):
        while True:
            metrics = await engine.metrics()
            if metrics.prompt_tokens_total >= expected:
                return metrics
            await asyncio.sleep(0.1)

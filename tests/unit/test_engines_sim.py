"""The simulated engine: prefix cache, tenant isolation, LRU, metrics, priority + chunking."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from eventlog.clock import LoopClock
from eventlog.errors import InvariantViolation
from replay.chat import ChatPrompt
from replay.engines.base import EngineUnavailable, ModelRevisionMismatch
from replay.engines.sim_core import (
    BLOCK_TOKENS,
    PrefillServerModel,
    PrefixCache,
    SchedulingPolicy,
    SimEngineConfig,
    block_keys,
    sim_tokenize,
)
from replay.engines.simulated import SimulatedEngine
from replay.model import EngineMetrics, PrefillRequest

RATE = 1000.0  # tokens/s: one 512-token chunk = 0.512 s


def _tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def _model(queue_max: int = 4096) -> PrefillServerModel:
    config = SimEngineConfig(
        prefill_tokens_per_s=RATE, cache_tokens=100_000, chunk_tokens=512, queue_max=queue_max
    )
    return PrefillServerModel(config)


def _run_all(model: PrefillServerModel) -> None:
    while (next_s := model.next_event_s()) is not None:
        model.advance(next_s)


def test_tokenizer_is_deterministic_and_frames_messages() -> None:
    messages = ChatPrompt(({"role": "user", "content": "hello world"},))
    assert sim_tokenize(messages) == sim_tokenize(messages)
    assert len(sim_tokenize(messages)) == 2 + 2 + 1 + 2


def test_second_prefill_of_same_prefix_hits_the_cache() -> None:
    model = _model()
    prompt = _tokens(0, 1000)
    model.submit(prompt, "tenant-a", 0, 0.0)
    _run_all(model)
    first = model.pop_completed()[0]
    assert first.cached_tokens == 0
    longer = [*prompt, *_tokens(5000, 100)]
    model.submit(longer, "tenant-a", 0, 10.0)
    _run_all(model)
    second = model.pop_completed()[0]
    assert second.cached_tokens == (1000 // BLOCK_TOKENS) * BLOCK_TOKENS
    assert second.ttft_s == pytest.approx((1100 - second.cached_tokens) / RATE)


def test_a_repeat_of_whole_blocks_recomputes_the_last_block_as_vllm_does() -> None:
    """vLLM caps a hit at ``prompt - 1`` tokens in *whole blocks*: the block holding the last
    token is computed again, not just the last token (tests/vllm/test_conformance.py holds
    both engines to ``(prompt - 1) // block * block``)."""
    model = _model()
    prompt = _tokens(0, 2 * BLOCK_TOKENS)
    for at_s in (0.0, 10.0):
        model.submit(prompt, "tenant-a", 0, at_s)
        _run_all(model)
    assert [done.cached_tokens for done in model.pop_completed()] == [0, BLOCK_TOKENS]


def test_cache_salt_isolates_tenants() -> None:
    model = _model()
    prompt = _tokens(0, 640)
    model.submit(prompt, "tenant-a", 0, 0.0)
    _run_all(model)
    model.submit(prompt, "tenant-b", 0, 5.0)
    _run_all(model)
    _, other = model.pop_completed()
    assert other.cached_tokens == 0


def test_lru_evicts_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity_tokens=4 * BLOCK_TOKENS)
    a = block_keys(_tokens(0, 2 * BLOCK_TOKENS), "t")
    b = block_keys(_tokens(1000, 2 * BLOCK_TOKENS), "t")
    c = block_keys(_tokens(2000, 2 * BLOCK_TOKENS), "t")
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup(a) == 2  # a is now more recent than b
    cache.insert(c)
    assert cache.lookup(b) == 0
    assert cache.lookup(a) == 2
    assert cache.lookup(c) == 2
    assert cache.evicted_blocks_total == 2


def test_metrics_are_monotone_and_shaped_like_vllm() -> None:
    model = _model()
    previous = model.metrics()
    for i in range(5):
        model.submit(_tokens(i * 10, 300), "t", 0, float(i))
        model.submit(_tokens(i * 10, 300), "t", 0, float(i))
        current = model.metrics()
        assert current.num_requests_running + current.num_requests_waiting == model.in_system
        _run_all(model)
        current = model.metrics()
        now, before = _counters(current), _counters(previous)
        assert now[0] >= before[0] and now[1] >= before[1] and now[2] >= now[1]
        assert current.generation_tokens_total == previous.generation_tokens_total + 2
        previous = current
    assert previous.num_requests_running == previous.num_requests_waiting == 0


def _counters(metrics: EngineMetrics) -> tuple[float, float, float]:
    """(prompt tokens, prefix cache hits, prefix cache queries): a simulator always has them."""
    counters = (metrics.prompt_tokens_total, metrics.prefix_cache_hits_total,
                metrics.prefix_cache_queries_total)  # fmt: skip
    assert None not in counters
    return cast(tuple[float, float, float], counters)


def _first_chunks(policy: SchedulingPolicy) -> dict[int, float]:
    model = PrefillServerModel(
        SimEngineConfig(prefill_tokens_per_s=RATE, chunk_tokens=512, scheduling_policy=policy)
    )
    model.submit(_tokens(0, 5000), "replay-tenant", 100, 0.0)  # starts at once: running
    model.submit(_tokens(90_000, 2000), "replay-tenant", 100, 0.0)  # waits behind it
    model.submit(_tokens(50_000, 200), "live-tenant", 0, 0.1)  # arrives mid-chunk
    _run_all(model)
    return {c.prompt_tokens: c.first_chunk_s for c in model.pop_completed()}


def test_a_running_replay_keeps_its_budget_and_priority_orders_only_the_waiting() -> None:
    """vLLM V1 schedules running requests first: the live request waits for the running
    replay's whole prefill (it fills every step's budget), but goes before the waiting one."""
    first = _first_chunks("priority")
    replay_end_s = 5000 / RATE
    assert first[200] == pytest.approx(replay_end_s - (5000 % 512) / RATE)  # shares that step
    assert first[200] < first[2000]


def test_fcfs_ignores_priority() -> None:
    first = _first_chunks("fcfs")
    assert first[2000] < first[200]


def test_cache_stats_are_counted_at_scheduling_and_prompt_tokens_at_completion() -> None:
    model = _model()
    prompt = _tokens(0, 2000)
    model.submit(prompt, "t", 0, 0.0)
    _run_all(model)
    model.submit(prompt + _tokens(7000, 3000), "t", 0, 10.0)  # 2000 cached (125 blocks), 6 chunks
    model.advance(10.0 + 0.001)
    chunked = model.metrics()
    assert chunked.prefix_cache_hits_total == 2000  # counted when scheduled ...
    assert chunked.prompt_tokens_total == 2000  # ... its prompt tokens not yet: hits run ahead
    assert chunked.computed_prompt_tokens_total == 2000
    _run_all(model)
    done = model.metrics()
    assert done.prompt_tokens_total == 7000
    assert done.computed_prompt_tokens_total == 2000 + 3000


def test_same_priority_is_fifo() -> None:
    model = _model()
    first = model.submit(_tokens(0, 1500), "t", 5, 0.0)
    second = model.submit(_tokens(10_000, 100), "t", 5, 0.1)
    _run_all(model)
    order = [c.ticket for c in model.pop_completed()]
    assert order == [first, second]


def test_full_queue_is_refused_and_time_cannot_go_back() -> None:
    model = _model(queue_max=2)
    model.submit(_tokens(0, 100), "t", 0, 0.0)
    model.submit(_tokens(0, 100), "t", 0, 0.0)
    with pytest.raises(EngineUnavailable):
        model.submit(_tokens(0, 100), "t", 0, 0.0)
    with pytest.raises(InvariantViolation):
        model.advance(-1.0)


async def test_async_engine_serves_concurrent_prefills_and_checks_revision() -> None:
    config = SimEngineConfig(prefill_tokens_per_s=1_000_000.0, cache_tokens=100_000)
    engine = SimulatedEngine("sim-0", "model@r1", config, LoopClock())
    try:
        messages = ChatPrompt(({"role": "user", "content": " ".join(f"w{i}" for i in range(800))},))

        def request(salt: str, rid: str) -> PrefillRequest:
            return PrefillRequest("model@r1", messages, salt, 0, rid)

        first = await engine.prefill(request("a", "1"))
        again, other = await asyncio.gather(
            engine.prefill(request("a", "2")), engine.prefill(request("b", "3"))
        )
        assert first.cached_prompt_tokens == 0
        assert again.cached_prompt_tokens == (first.prompt_tokens // 16) * 16
        assert other.cached_prompt_tokens == 0
        with pytest.raises(ModelRevisionMismatch):
            await engine.prefill(PrefillRequest("model@r2", messages, "a", 0, "4"))
        metrics = await engine.metrics()
        assert metrics.prompt_tokens_total == 3 * first.prompt_tokens
    finally:
        await engine.aclose()
    with pytest.raises(EngineUnavailable):
        await engine.prefill(PrefillRequest("model@r1", messages, "a", 0, "5"))

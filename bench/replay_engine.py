"""KV replay after a region failure on a real engine, in wall-clock time: the part of
``bench/replay.py --engine URL`` that talks to the engine (a vLLM started as replay needs it:
``docs/replay-engines.md``).

One region's view, on one engine: ``moved`` conversations arrive from a failed region (cold),
``own`` conversations are the region's (warm: prefilled before t=0 under their salt). From t=0
live traffic runs on a seeded schedule, identical in both runs: turns of own conversations
(their prompt plus a new user message: the prefix is cached) at ``live_turns_per_s`` (Poisson),
and each moved conversation's next turn after an exponential wait of mean ``moved_return_mean_s``
(its whole history cold, unless replay rebuilt it first). Every live request is a 1-token
completion at priority 0; its TTFT is its response time.

The run is done twice, each under fresh cache salts (no run reuses the other's cache):

- with replay: the moved conversations are replayed in order at priority 100 (in message
  prefixes of about ``piece_tokens`` each: ``replay.chat.replay_pieces``), each admitted by the
  production ``CapacityController`` fed from the engine's own ``/metrics`` by the
  ``CapacityPoller``; a conversation whose live turn came first is not replayed (``mark_live``);
- without replay: the same live schedule, up to the with-replay run's makespan.

Capacity is measured first: unique prompts of the conversations' size sent ``calibration_concurrency``
at a time, the engine's computed prompt tokens (``prompt_tokens_by_source{local_compute}``) over
the wall time. The bound is the simulator's (``bench/replay.py``): replayed computed tokens over
the measured mean spare, ``(capacity x (1 - headroom) x makespan - live computed) / makespan``.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from eventlog.clock import SystemClock
from replay.capacity import CapacityConfig, CapacityController, CapacityPoller, Grant
from replay.chat import ChatPrompt, replay_pieces
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import EngineMetrics, PrefillRequest
from replay.worker import WorkerConfig

LIVE_PRIORITY = 0
REPLAY_PRIORITY = 100
TENANT = "bench"
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EngineParams:
    seed: int = 7
    moved: int = 96  # conversations moved here by the failure
    own: int = 8  # the region's own, warm conversations
    history_words: tuple[int, int] = (250, 700)  # a conversation's history, in words
    turn_words: int = 40  # a live turn's new user message
    live_turns_per_s: float = 4.0  # own conversations' turns
    moved_return_mean_s: float = 60.0  # a moved conversation's next turn: mean wait
    headroom: float = 0.1
    max_concurrent_replays: int = 2
    piece_tokens: int = WorkerConfig().piece_tokens_max  # the worker's default
    tick_s: float = 0.05
    poll_s: float = 0.25
    calibration_requests: int = 24
    calibration_concurrency: int = 4
    horizon_max_s: float = 600.0
    #: the operator's word, for the self-check (counts only where its queue probe cannot tell)
    priority_declared: bool = False


@dataclass
class LiveTurn:
    arrival_s: float
    prompt: ChatPrompt
    moved_index: int | None  # which moved conversation, None for an own one


@dataclass
class RunResult:
    makespan_s: float = math.nan
    replayed: int = 0
    replayed_computed_tokens: int = 0
    skipped_live_first: int = 0
    live_computed_tokens_to_makespan: float = 0.0
    #: (arrival s, ttft ms) of live turns: the region's own conversations, the moved ones
    own_ttft_ms: list[tuple[float, float]] = field(default_factory=list)
    moved_ttft_ms: list[tuple[float, float]] = field(default_factory=list)
    live_cached_tokens: int = 0
    live_prompt_tokens: int = 0
    denied: dict[str, int] = field(default_factory=dict)


def _words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(20_000)}" for _ in range(count))


def _history(rng: random.Random, words: int, tag: str) -> list[dict[str, Any]]:
    turns = max(2, words // 80)
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"{tag}: be brief."}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": _words(rng, words // turns)})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": _words(rng, 10)})
    return messages


@dataclass
class Scenario:
    moved: list[ChatPrompt]
    own: list[ChatPrompt]
    turns: list[LiveTurn]

    @classmethod
    def build(cls, p: EngineParams) -> Scenario:
        rng = random.Random(p.seed)
        moved = [ChatPrompt.of_messages(_history(rng, rng.randint(*p.history_words), f"m{i}"))
                 for i in range(p.moved)]  # fmt: skip
        own = [ChatPrompt.of_messages(_history(rng, rng.randint(*p.history_words), f"o{i}"))
               for i in range(p.own)]  # fmt: skip
        turns: list[LiveTurn] = []
        for index, prompt in enumerate(moved):
            arrival_s = rng.expovariate(1 / p.moved_return_mean_s)
            turns.append(LiveTurn(arrival_s, _next_turn(rng, prompt, p.turn_words), index))
        t = rng.expovariate(p.live_turns_per_s)
        while t < p.horizon_max_s:
            prompt = own[rng.randrange(len(own))]
            turns.append(LiveTurn(t, _next_turn(rng, prompt, p.turn_words), None))
            t += rng.expovariate(p.live_turns_per_s)
        turns.sort(key=lambda turn: turn.arrival_s)
        return cls(moved, own, turns)


def _next_turn(rng: random.Random, prompt: ChatPrompt, words: int) -> ChatPrompt:
    new = ({"role": "assistant", "content": _words(rng, 8)},
           {"role": "user", "content": _words(rng, words)})  # fmt: skip
    return ChatPrompt((*prompt.messages, *new))


class EngineBench:
    def __init__(self, url: str, params: EngineParams) -> None:
        self.url = url
        self.p = params
        self.scenario = Scenario.build(params)
        self.model = ""
        #: the worker's self-check's priority_scheduling verdict (``check``)
        self.priority_verdict = ""
        self.priority_reason = ""
        self.capacity_tokens_per_s = 0.0
        self._client = httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S,
                                         limits=httpx.Limits(max_connections=256))  # fmt: skip

    async def aclose(self) -> None:
        await self._client.aclose()

    async def discover(self) -> None:
        models = (await self._client.get("/v1/models")).json()["data"]
        if len(models) != 1:
            raise SystemExit(f"{self.url} serves {len(models)} models; the bench needs one")
        self.model = str(models[0]["id"])

    async def complete(
        self, prompt: ChatPrompt, salt: str, priority: int
    ) -> tuple[dict[str, Any], float]:
        """One 1-token completion; (usage, response time ms)."""
        body = {"model": self.model, **prompt.request_fields(), "max_completion_tokens": 1,
                "temperature": 0, "priority": priority, "cache_salt": salt}  # fmt: skip
        started = time.monotonic()
        reply = await self._client.post("/v1/chat/completions", json=body)
        elapsed_ms = (time.monotonic() - started) * 1000
        if reply.status_code != 200:
            raise SystemExit(f"{self.url} answered {reply.status_code}: {reply.text[:300]}")
        usage: dict[str, Any] = reply.json()["usage"]
        return usage, elapsed_ms

    async def metrics(self) -> EngineMetrics:
        engine = VllmHttpEngine("bench", self.url, self.model, client=self._client)
        return await engine.metrics()

    async def check(self) -> None:
        """The worker's self-check, as a worker would run it: replay takes the whole spare
        only where priority scheduling passed (``SpareGate.set_priority_verified``)."""
        engine = VllmHttpEngine("bench", self.url, self.model, client=self._client)
        fitness = await engine.self_check(
            REPLAY_PRIORITY, priority_declared=self.p.priority_declared
        )
        self.priority_verdict = fitness.verdict("priority_scheduling") or ""
        self.priority_reason = fitness.reasons().get("priority_scheduling", "")

    async def calibrate(self) -> float:
        """Prefill tokens/s the engine computes, unique prompts of the scenario's size."""
        rng = random.Random(self.p.seed + 1)
        prompts = [ChatPrompt.of_messages(_history(rng, self.p.history_words[1], f"c{i}"))
                   for i in range(self.p.calibration_requests)]  # fmt: skip
        salt = secrets.token_hex(16)
        await self.complete(prompts[0], salt, LIVE_PRIORITY)  # a first request warms up
        before = _computed(await self.metrics())
        started = time.monotonic()
        gate = asyncio.Semaphore(self.p.calibration_concurrency)

        async def one(prompt: ChatPrompt) -> None:
            async with gate:
                await self.complete(prompt, salt, LIVE_PRIORITY)

        await asyncio.gather(*(one(prompt) for prompt in prompts[1:]))
        elapsed_s = time.monotonic() - started
        computed = await _settled_computed(self, before)
        self.capacity_tokens_per_s = computed / elapsed_s
        return self.capacity_tokens_per_s

    async def run(self, with_replay: bool, horizon_s: float | None) -> RunResult:
        result = RunResult()
        salt = secrets.token_hex(16)  # this run's: the other run's cache is never hit
        await asyncio.gather(*(self.complete(p, salt, LIVE_PRIORITY) for p in self.scenario.own))
        lived: set[int] = set()
        base = _computed(await self.metrics())
        t0 = time.monotonic()
        replay_task = None
        if with_replay:
            replay_task = asyncio.create_task(self._replay(salt, lived, t0, base, result))
        live_tasks = []
        for turn in self.scenario.turns:
            if horizon_s is not None and turn.arrival_s > horizon_s:
                break
            if replay_task is not None and replay_task.done():
                break
            await asyncio.sleep(max(0.0, t0 + turn.arrival_s - time.monotonic()))
            if turn.moved_index is not None:
                lived.add(turn.moved_index)
            live_tasks.append(asyncio.create_task(self._live(turn, salt, result)))
        if replay_task is not None:
            await replay_task
        await asyncio.gather(*live_tasks)
        if not with_replay:
            result.makespan_s = horizon_s if horizon_s is not None else math.nan
        return result

    async def _live(self, turn: LiveTurn, salt: str, result: RunResult) -> None:
        usage, elapsed_ms = await self.complete(turn.prompt, salt, LIVE_PRIORITY)
        samples = result.own_ttft_ms if turn.moved_index is None else result.moved_ttft_ms
        samples.append((turn.arrival_s, elapsed_ms))
        result.live_prompt_tokens += int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        result.live_cached_tokens += int(details.get("cached_tokens") or 0)

    async def _replay(
        self, salt: str, lived: set[int], t0: float, base: float, result: RunResult
    ) -> None:
        """The moved conversations, in order, each admitted by the capacity controller."""
        clock = SystemClock()
        engine = VllmHttpEngine("bench", self.url, self.model, client=self._client)
        config = CapacityConfig(self.capacity_tokens_per_s, headroom=self.p.headroom,
                                max_concurrent_replays=self.p.max_concurrent_replays)  # fmt: skip
        controller = CapacityController(config, clock)
        controller.set_priority_verified(self.priority_verdict == "passed")
        poller = CapacityPoller(engine, controller, clock, random.Random(self.p.seed),
                                interval_s=self.p.poll_s)  # fmt: skip
        poll_task = asyncio.create_task(poller.run())
        running: set[asyncio.Task[None]] = set()
        try:
            for index, prompt in enumerate(self.scenario.moved):
                estimate = sum(len(str(m.get("content") or "")) for m in prompt.messages) // 4
                while True:
                    if index in lived:
                        result.skipped_live_first += 1
                        break
                    grant = controller.try_acquire(estimate, TENANT)
                    if grant is Grant.GRANTED:
                        task = asyncio.create_task(self._replay_one(prompt, salt, controller,
                                                                    result))  # fmt: skip
                        running.add(task)
                        task.add_done_callback(running.discard)
                        break
                    result.denied[grant.value] = result.denied.get(grant.value, 0) + 1
                    await asyncio.sleep(self.p.tick_s)
            await asyncio.gather(*running)
            result.makespan_s = time.monotonic() - t0
            computed = _computed(await self.metrics()) - base
            result.live_computed_tokens_to_makespan = computed - result.replayed_computed_tokens
        finally:
            poll_task.cancel()
            await asyncio.gather(poll_task, return_exceptions=True)

    async def _replay_one(
        self, prompt: ChatPrompt, salt: str, controller: CapacityController, result: RunResult
    ) -> None:
        engine = VllmHttpEngine("bench", self.url, self.model, client=self._client)
        computed = 0
        try:
            for piece in replay_pieces(prompt, self.p.piece_tokens):
                outcome = await engine.prefill(PrefillRequest(
                    self.model, piece, salt, REPLAY_PRIORITY, secrets.token_hex(8)))  # fmt: skip
                computed += outcome.prompt_tokens - outcome.cached_prompt_tokens
        finally:
            controller.release(computed)
        result.replayed += 1
        result.replayed_computed_tokens += computed


def _computed(metrics: EngineMetrics) -> float:
    if metrics.computed_prompt_tokens_total is None:
        raise SystemExit("the engine exports no prompt_tokens_by_source{local_compute}")
    return metrics.computed_prompt_tokens_total


async def _settled_computed(bench: EngineBench, before: float) -> float:
    """The computed tokens since ``before`` once the counters stop moving (vLLM counts just
    after answering)."""
    last = -1.0
    for _ in range(50):
        now = _computed(await bench.metrics()) - before
        if now == last:
            return now
        last = now
        await asyncio.sleep(0.1)
    return last


@dataclass
class EngineReport:
    model: str
    priority_verdict: str
    priority_reason: str
    capacity_tokens_per_s: float
    tokens_per_word: float
    with_replay: RunResult
    without_replay: RunResult

    def bound_s(self, headroom: float) -> float:
        """Replayed computed tokens over the measured mean spare (``bench/replay.py``)."""
        r = self.with_replay
        usable = self.capacity_tokens_per_s * (1 - headroom) * r.makespan_s
        spare_rate = (usable - r.live_computed_tokens_to_makespan) / r.makespan_s
        return r.replayed_computed_tokens / spare_rate if spare_rate > 0 else math.inf


async def measure(url: str, params: EngineParams, repeats: int = 1) -> list[EngineReport]:
    """Calibrate, then ``repeats`` pairs of runs: with replay, then without it to the same
    makespan (pairs, because the load of a shared machine drifts between runs)."""
    bench = EngineBench(url, params)
    reports = []
    try:
        await bench.discover()
        await bench.check()
        capacity = await bench.calibrate()
        sample = ChatPrompt.of_messages(_history(random.Random(0), params.history_words[1], "s"))
        usage, _ = await bench.complete(sample, secrets.token_hex(16), LIVE_PRIORITY)
        tokens_per_word = int(usage["prompt_tokens"]) / params.history_words[1]
        for _ in range(repeats):
            with_replay = await bench.run(True, None)
            without = await bench.run(False, with_replay.makespan_s)
            reports.append(
                EngineReport(
                    bench.model,
                    bench.priority_verdict,
                    bench.priority_reason,
                    capacity,
                    tokens_per_word,
                    with_replay,
                    without,
                )
            )
    finally:
        await bench.aclose()
    return reports

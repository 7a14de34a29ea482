"""``SimulatedEngine``: the inference-engine port over the simulator core (``sim_core``).

A *simulator*, not an inference server: it computes nothing, it only reproduces vLLM's prefill
timing and prefix-cache behaviour (see ``replay.engines.sim_core``). Time comes from the injected
``Clock``: with ``LoopClock`` on a virtual-time loop it runs in virtual time; with the system
clock (the HTTP server, ``convplane sim-engine serve``) it runs in real time.

One driver task (started on the first prefill, stopped by ``aclose``) sleeps until the chunk in
progress ends, advances the core and resolves the waiting requests. Chunks are not preempted, so
a new request only needs to wake the driver when the server was idle.
"""

from __future__ import annotations

import asyncio
import contextlib

from eventlog.clock import Clock
from eventlog.errors import InvariantViolation
from replay.engines import vllm_check as checks
from replay.engines.base import (
    EngineRejectedRequest,
    EngineUnavailable,
    InferenceEngine,
    ModelRevisionMismatch,
)
from replay.engines.sim_core import (
    PrefillServerModel,
    SimCompletion,
    SimEngineConfig,
    sim_tokenize,
)
from replay.model import (
    EngineCheck,
    EngineFitness,
    EngineMetrics,
    PrefillOutcome,
    PrefillRequest,
)

UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


class SimulatedEngine(InferenceEngine):
    def __init__(
        self, engine_id: str, model_revision: str, config: SimEngineConfig, clock: Clock
    ) -> None:
        self._engine_id = engine_id
        self._model_revision = model_revision
        self._clock = clock
        self.core = PrefillServerModel(config)
        self._waiters: dict[int, asyncio.Future[SimCompletion]] = {}
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def engine_id(self) -> str:
        return self._engine_id

    @property
    def model_revision(self) -> str:
        return self._model_revision

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        if self._closed:
            raise EngineUnavailable(f"simulated engine {self._engine_id} is closed")
        if request.model != self._model_revision:
            raise ModelRevisionMismatch(
                f"engine {self._engine_id} serves {self._model_revision!r}, not {request.model!r}"
            )
        config = self.core.config
        if request.prompt.chat_template is not None and not config.trust_request_chat_template:
            raise EngineRejectedRequest(UNTRUSTED_TEMPLATE)  # vLLM's words
        tokens = sim_tokenize(request.prompt)
        if len(tokens) + 1 > config.max_model_len:
            raise EngineRejectedRequest(
                f"This model's maximum context length is {config.max_model_len} tokens. "
                f"However, your request has {len(tokens)} input tokens."
            )
        was_idle = self.core.next_event_s() is None
        ticket = self.core.submit(
            tokens, request.cache_salt, request.priority, self._clock.monotonic()
        )
        future: asyncio.Future[SimCompletion] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        self._ensure_driver()
        if was_idle:
            self._wake.set()
        try:
            done = await future
        finally:
            self._waiters.pop(ticket, None)
        details = self.core.config.prompt_tokens_details
        return PrefillOutcome(
            prompt_tokens=done.prompt_tokens,
            # like vLLM's usage: cached tokens only with --enable-prompt-tokens-details
            cached_prompt_tokens=done.cached_tokens if details else 0,
            duration_ms=done.ttft_s * 1000.0,
            cached_reported=details,
        )

    async def self_check(
        self, replay_priority: int, *, priority_declared: bool = False
    ) -> EngineFitness:
        """The simulator knows its own configuration, priority included (its HTTP face is
        probed like vLLM, ``replay.engines.vllm_check``)."""
        config = self.core.config
        known = {
            checks.SERVES_REVISION: True,
            checks.EXPORTS_METRICS: config.log_stats,
            checks.ACCEPTS_TOOLS: not config.exclude_tools_when_tool_choice_none,
            checks.ACCEPTS_CHAT_TEMPLATE: config.trust_request_chat_template,
            checks.CACHES_PREFIXES: config.cache_tokens > 0,
            checks.REPORTS_CACHED_TOKENS: config.prompt_tokens_details,
            checks.PRIORITY_SCHEDULING: config.scheduling_policy == "priority",
        }
        return EngineFitness(
            tuple(
                EngineCheck(name, "passed")
                if ok
                else EngineCheck(
                    name, "failed", f"simulated engine {self._engine_id} is configured without it"
                )
                for name, ok in known.items()
            )
        )

    async def metrics(self) -> EngineMetrics:
        self.core.advance(self._clock.monotonic())
        self._resolve()
        return self.core.metrics()

    async def aclose(self) -> None:
        self._closed = True
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(EngineUnavailable("simulated engine closed"))
        self._waiters.clear()

    def _ensure_driver(self) -> None:
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(
                self._drive(), name=f"sim-engine-{self._engine_id}"
            )

    async def _drive(self) -> None:
        while True:
            now_s = self._clock.monotonic()
            self.core.advance(now_s)
            self._resolve()
            next_s = self.core.next_event_s()
            if next_s is None:
                self._wake.clear()
                await self._wake.wait()
            else:
                await self._clock.sleep(max(0.0, next_s - now_s))

    def _resolve(self) -> None:
        for done in self.core.pop_completed():
            future = self._waiters.get(done.ticket)
            if future is None:
                continue  # the caller was cancelled; the engine still did the work
            if future.done():
                raise InvariantViolation(f"ticket {done.ticket} completed twice")
            future.set_result(done)

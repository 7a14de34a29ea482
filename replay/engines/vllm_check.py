"""The replay self-check of a vLLM server (``VllmHttpEngine.self_check``).

Replay on an engine only pays off, and only stays out of live traffic's way, when the server
passes each check below. Every probe is a prefill-only request (one output token) at replay's
priority under a fresh random ``cache_salt`` (no tenant's cache is touched), sent the way replay
sends it (``VllmHttpEngine.prefill``).

``serves_revision``
    ``GET /v1/models`` lists the pinned revision as a served model name (vLLM does not expose
    the weights revision, so deployments start vLLM with ``--served-model-name name@revision
    --revision <commit>``; a 404 on a request means the same). The card's ``max_model_len``
    sizes the probes.
``exports_metrics``
    ``GET /metrics`` has the ``vllm:`` series the capacity controller reads (absent with
    ``--disable-log-stats``): without them live load is unknown and replay would take the
    whole engine.
``accepts_tools``
    A conversation with tool calls, tool results and ``tools`` is accepted and its tools reach
    the prompt. Replay sends ``tool_choice: "none"`` (a prefill never calls a tool), which vLLM
    accepts without ``--enable-auto-tool-choice``; where the server also takes ``"auto"`` (the
    live path's default), both must render the same number of prompt tokens, or the live
    turn misses the cache (``--exclude-tools-when-tool-choice-none``).
``accepts_chat_template``
    A request with its own ``chat_template`` (a conversation's stored template) is accepted:
    vLLM refuses it unless started with ``--trust-request-chat-template``.
``caches_prefixes`` and ``reports_cached_tokens``
    The same prompt of many blocks, sent twice, reports cached tokens the second time
    (``--enable-prefix-caching``, ``--enable-prompt-tokens-details``). The prompt is sized from
    the server's ``max_model_len``: a first short probe measures this tokenizer's tokens per
    word.
``priority_scheduling``
    Cannot be verified from outside: vLLM under FCFS takes ``priority`` with a 200 and ignores
    it. ``failed`` when a probe's priority is refused (older vLLM), ``passed`` only when the
    operator declares ``--scheduling-policy priority`` (``--declare-priority-scheduling``),
    ``unverified`` otherwise: the engine stays fit, and replay takes a smaller share of its
    spare (``CapacityConfig.unverified_priority_share``).

A check whose probe could not run (an earlier probe failed) is ``unverified``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import NoReturn

from replay.chat import ChatPrompt
from replay.engines.base import (
    REPLAY_TOOL_CHOICE,
    EngineRejectedRequest,
    EngineUnavailable,
    ModelRevisionMismatch,
)
from replay.model import (
    CheckVerdict,
    EngineCheck,
    EngineFitness,
    EngineMetrics,
    PrefillOutcome,
    PrefillRequest,
)

SERVES_REVISION = "serves_revision"
EXPORTS_METRICS = "exports_metrics"
ACCEPTS_TOOLS = "accepts_tools"
ACCEPTS_CHAT_TEMPLATE = "accepts_chat_template"
CACHES_PREFIXES = "caches_prefixes"
REPORTS_CACHED_TOKENS = "reports_cached_tokens"
PRIORITY_SCHEDULING = "priority_scheduling"
CHECKS = (
    SERVES_REVISION,
    EXPORTS_METRICS,
    ACCEPTS_TOOLS,
    ACCEPTS_CHAT_TEMPLATE,
    CACHES_PREFIXES,
    REPORTS_CACHED_TOKENS,
    PRIORITY_SCHEDULING,
)

PROBE_TOKENS_MAX = 1024  # many blocks at any block size vLLM supports (16 .. 128 tokens)
SIZING_WORDS = 64  # the first probe: measures the tokenizer's tokens per word
PROBE_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
PROBE_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
)
PROBE_TOOL_MESSAGES = (
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_probe",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_probe", "content": "sunny, 21 C"},
)

ServedModels = Callable[[], Awaitable[Mapping[str, int | None]]]
#: a prefill as replay sends it, with the ``tool_choice`` to send when the prompt has tools
Prefill = Callable[[PrefillRequest, str], Awaitable[PrefillOutcome]]
Metrics = Callable[[], Awaitable[EngineMetrics]]


class _Stop(Exception):
    """A probe could not run (unreachable, wrong revision): the remaining checks stay open."""


async def run_self_check(
    model_revision: str,
    served_models: ServedModels,
    prefill: Prefill,
    metrics: Metrics,
    *,
    replay_priority: int,
    priority_declared: bool,
) -> EngineFitness:
    check = _SelfCheck(model_revision, prefill, replay_priority)
    try:
        max_model_len = await check.served(served_models)
        await check.metrics(metrics)
        await check.tools()
        await check.chat_template()
        await check.prefix_cache(max_model_len)
    except _Stop:
        pass
    check.priority(priority_declared)
    return check.fitness()


class _SelfCheck:
    def __init__(
        self,
        model_revision: str,
        prefill: Prefill,
        replay_priority: int,
    ) -> None:
        self._revision = model_revision
        self._prefill = prefill
        self._priority = replay_priority
        self._sent = 0
        self._salt = secrets.token_hex(32)
        self._found: dict[str, EngineCheck] = {}

    def fitness(self) -> EngineFitness:
        missing = "not probed: an earlier probe could not run"
        return EngineFitness(
            tuple(self._found.get(n) or EngineCheck(n, "unverified", missing) for n in CHECKS)
        )

    def _record(self, name: str, verdict: CheckVerdict, reason: str = "") -> None:
        if name not in self._found:  # the first finding stands
            self._found[name] = EngineCheck(name, verdict, reason)

    async def served(self, served_models: ServedModels) -> int | None:
        try:
            served = await served_models()
        except EngineUnavailable as exc:
            self._record(SERVES_REVISION, "failed", f"GET /v1/models failed: {exc.message}")
            raise _Stop from exc
        if self._revision not in served:
            self._record(
                SERVES_REVISION,
                "failed",
                f"serves {sorted(served)}, not the pinned revision {self._revision!r}: "
                "start it with --served-model-name <name>@<revision>",
            )
            raise _Stop
        self._record(SERVES_REVISION, "passed")
        return served[self._revision]

    async def metrics(self, metrics: Metrics) -> None:
        try:
            await metrics()
        except EngineUnavailable as exc:  # EngineMetricsMissing included
            self._record(EXPORTS_METRICS, "failed", exc.message)
            return
        self._record(EXPORTS_METRICS, "passed")

    async def tools(self) -> None:
        with_tools = ChatPrompt(PROBE_TOOL_MESSAGES, tools=PROBE_TOOLS)
        replayed = await self._probe(ACCEPTS_TOOLS, with_tools, "tools")
        if replayed is None:
            return
        try:
            live = await self._prefill(self._request(with_tools, "tools"), "auto")
        except EngineRejectedRequest:
            # no auto tool choice on this server: the live path cannot send tools without
            # tool_choice either; replay's request was accepted, which is what counts here
            self._record(ACCEPTS_TOOLS, "passed")
            return
        except (EngineUnavailable, ModelRevisionMismatch) as exc:
            self._stop(ACCEPTS_TOOLS, exc)
        if live.prompt_tokens != replayed.prompt_tokens:
            self._record(
                ACCEPTS_TOOLS,
                "failed",
                f"tool_choice none renders {replayed.prompt_tokens} prompt tokens and "
                f"auto {live.prompt_tokens}: the live turn would miss replay's cache; "
                "start it without --exclude-tools-when-tool-choice-none",
            )
            return
        self._record(ACCEPTS_TOOLS, "passed")

    async def chat_template(self) -> None:
        prompt = ChatPrompt(
            ({"role": "user", "content": "template probe"},), chat_template=PROBE_TEMPLATE
        )
        if await self._probe(ACCEPTS_CHAT_TEMPLATE, prompt, "template") is not None:
            self._record(ACCEPTS_CHAT_TEMPLATE, "passed")

    async def prefix_cache(self, max_model_len: int | None) -> None:
        target_tokens = PROBE_TOKENS_MAX
        if max_model_len is not None:
            target_tokens = min(target_tokens, max_model_len // 2)
        sizing = await self._probe(CACHES_PREFIXES, _words_prompt(SIZING_WORDS), "sizing")
        if sizing is None:
            return
        tokens_per_word = max(sizing.prompt_tokens / SIZING_WORDS, 1e-9)  # overhead included
        prompt = _words_prompt(max(1, int(target_tokens / tokens_per_word)))
        first = await self._probe(CACHES_PREFIXES, prompt, "cache")
        second = await self._probe(CACHES_PREFIXES, prompt, "cache")
        if first is None or second is None:
            return
        if not second.cached_reported:
            self._record(
                REPORTS_CACHED_TOKENS,
                "failed",
                "does not report cached tokens: start it with --enable-prompt-tokens-details",
            )
            self._record(CACHES_PREFIXES, "unverified", "cached tokens are not reported")
            return
        self._record(REPORTS_CACHED_TOKENS, "passed")
        if second.cached_prompt_tokens <= 0:
            self._record(
                CACHES_PREFIXES,
                "failed",
                f"a repeated {second.prompt_tokens}-token prompt hit no cache: start "
                "it with --enable-prefix-caching",
            )
            return
        self._record(CACHES_PREFIXES, "passed")

    def priority(self, declared: bool) -> None:
        if declared:
            self._record(PRIORITY_SCHEDULING, "passed")
            return
        self._record(
            PRIORITY_SCHEDULING,
            "unverified",
            "vLLM accepts a request priority under FCFS too and ignores it, so it "
            "cannot be checked from outside: start it with --scheduling-policy "
            "priority and declare that (--declare-priority-scheduling); until then "
            "replay takes a smaller share of its spare",
        )

    async def _probe(self, name: str, prompt: ChatPrompt, tag: str) -> PrefillOutcome | None:
        """One probe for check ``name``: its outcome, or None when refused (recorded)."""
        try:
            return await self._prefill(self._request(prompt, tag), REPLAY_TOOL_CHOICE)
        except EngineRejectedRequest as exc:
            if "priority" in exc.message.lower():
                self._record(
                    PRIORITY_SCHEDULING,
                    "failed",
                    "refuses request priorities: start it with --scheduling-policy "
                    f"priority ({exc.message[:200]})",
                )
            self._record(name, "failed", _refusal_reason(name, exc.message))
            return None
        except (EngineUnavailable, ModelRevisionMismatch) as exc:
            self._stop(name, exc)

    def _stop(self, name: str, exc: EngineUnavailable | ModelRevisionMismatch) -> NoReturn:
        failed = SERVES_REVISION if isinstance(exc, ModelRevisionMismatch) else name
        self._found.pop(failed, None)  # a 404 now outranks the model list's earlier pass
        self._record(failed, "failed", exc.message)
        raise _Stop from exc

    def _request(self, prompt: ChatPrompt, tag: str) -> PrefillRequest:
        self._sent += 1
        return PrefillRequest(
            self._revision,
            prompt,
            f"{self._salt}-{tag}",
            self._priority,
            f"check-{self._salt[:8]}-{self._sent}",
        )


def _words_prompt(words: int) -> ChatPrompt:
    text = " ".join(f"probe{i % 101}" for i in range(words))
    return ChatPrompt(({"role": "user", "content": text},))


def _refusal_reason(name: str, message: str) -> str:
    hints = {
        ACCEPTS_TOOLS: "refuses replay's tool-using request",
        ACCEPTS_CHAT_TEMPLATE: "refuses a conversation's stored chat template: start it with "
        "--trust-request-chat-template",
        CACHES_PREFIXES: "refuses the cache probe",
    }
    return f"{hints.get(name, 'refuses a probe')} ({message[:300]})"

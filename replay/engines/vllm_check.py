"""The replay self-check of a vLLM server (``VllmHttpEngine.self_check``).

Replay on an engine only pays off, and only stays out of live traffic's way, when the server
passes each check below. Every probe is a prefill-only request (one output token) at replay's
priority (the priority probe's short prompt at a live one) under a fresh random ``cache_salt``
(no tenant's cache is touched), sent the way replay sends it (``VllmHttpEngine.prefill``).

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
    Verified by behaviour, since vLLM under FCFS takes ``priority`` with a 200 and ignores it:
    ``QUEUE_PROBE_REQUESTS`` prompts of ``QUEUE_PROBE_ROUND_TOKENS`` tokens at replay's
    priority build a queue; once the first is answered, one short prompt at a live request's
    priority joins it. A priority scheduler answers it while the replay-priority ones queued
    before it still wait (``passed``); FCFS answers it with the last of them (``failed``: replay
    would compete first-come-first-served with live users). When the engine ran the queue in
    too few scheduler steps to tell (a step budget many times the prompts), or faster than
    requests go through the server (``QUEUE_PACE``: the answers' order is then the server's,
    not the scheduler's), or the timing is
    in between, in each of its rounds, it is ``unverified``: ``passed`` if
    the operator declares ``--scheduling-policy priority`` (``--declare-priority-scheduling``);
    otherwise the engine stays fit, and replay takes a smaller share of its spare and only
    while no live request is in the engine (``CapacityConfig.unverified_priority_share``). A
    declaration never outranks a ``failed``. The probe also ends ``unverified``, with the
    reason, when a queued prompt is refused or the engine fails under it (a gateway's size or
    rate limit is not a scheduling policy; only a refused ``priority`` fails the check), when
    it takes longer than ``QUEUE_PROBE_BUDGET_S`` (a busy engine runs replay-priority work
    last; a round's prompts are sized so that the engine's pace, measured by the cache
    probe, drains them within ``QUEUE_ROUND_S``). The base URL
    must be one engine: behind a load balancer the short prompt may reach an idle replica and
    overtake a queue it never joined.

A check whose probe could not run (an earlier probe failed) is ``unverified``.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
#: the priority probe's rounds, while the timing cannot tell: each this many replay-priority
#: prompts of this many tokens (at most 90% of the server's max_model_len), then one short
#: prompt at a live priority. Small first: the probe delays an FCFS engine's live requests;
#: larger after, for a scheduler step budget that took the small queue in too few steps
QUEUE_PROBE_ROUND_TOKENS = (1024, 4096, 4096)
QUEUE_PROBE_REQUESTS = 10
#: the whole priority probe, every round: about half the worker's check timeout (60 s)
QUEUE_PROBE_BUDGET_S = 30.0
#: a round's prompts are made smaller where the engine would take longer than this for them
#: (its pace from the first cache probe): no round outlives the budget, leaving work behind
QUEUE_ROUND_S = 5.0
QUEUE_PROBE_TOKENS_MIN = 64  # smaller prompts than this: too slow an engine to probe
QUEUE_PROBE_LIVE_WORDS = 16
LIVE_PRIORITY = 0  # vLLM's default: what a live request carries
#: judging the queue (``judge_queue``), in fractions of the time the queue took to drain
QUEUE_STEPS_NEEDED = 4  # distinct answer times (scheduler steps) still ahead when it joined
QUEUE_TIE = 0.1  # answers closer than this came from one scheduler step
QUEUE_OVERTOOK = 0.6  # answered within this: it overtook the queue
QUEUE_LAST = 0.95  # answered this late: it waited behind the whole queue
#: the queue must take this many times as long to drain as its prompts' round trips one by
#: one would: then its answers came at the pace of the engine's steps
QUEUE_PACE = 2.0
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


class _QueueProbeFailed(Exception):
    """The priority probe could not finish: the message says why (the check stays open)."""


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
        await check.priority_probe(max_model_len)
    except _Stop:
        pass
    check.priority_declared(priority_declared)
    return check.fitness()


def judge_queue(
    live_answered_s: float, queued_answered_s: Sequence[float], round_trip_s: float
) -> CheckVerdict:
    """The priority probe's verdict. ``live_answered_s``: when the live-priority prompt was
    answered, ``queued_answered_s``: when each replay-priority prompt still unanswered as it
    was sent was answered, both in seconds after it was sent; ``round_trip_s``: the short
    prompt's round trip on the idle engine."""
    if not queued_answered_s:
        return "unverified"
    drained_s = max(queued_answered_s)
    if drained_s < QUEUE_PACE * len(queued_answered_s) * round_trip_s:
        # answers at the pace requests go through the server, not of the engine's steps: the
        # engine may have prefilled the whole queue before the live prompt reached it
        return "unverified"
    tie_s = QUEUE_TIE * drained_s
    answers = sorted(queued_answered_s)
    steps = 1 + sum(1 for a, b in itertools.pairwise(answers) if b - a > tie_s)
    if drained_s <= 0 or steps < QUEUE_STEPS_NEEDED:
        return "unverified"  # the engine took the queue in too few steps to tell
    if live_answered_s >= QUEUE_LAST * drained_s:
        return "failed"
    overtaken = sum(1 for t in queued_answered_s if t > live_answered_s + tie_s)
    if live_answered_s <= QUEUE_OVERTOOK * drained_s and overtaken >= 2:
        return "passed"
    return "unverified"


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
        self._tokens_per_word: float | None = None  # measured by the sizing probe
        #: seconds per prompt token of the first cache probe, uncached (overhead included)
        self._seconds_per_token: float | None = None
        self._unclear_queue = ""  # the priority probe's timings when it could not tell

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
            live = await self._prefill(self._request(with_tools, "tools", self._priority), "auto")
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
        self._tokens_per_word = tokens_per_word
        prompt = _words_prompt(max(1, int(target_tokens / tokens_per_word)))
        first = await self._probe(CACHES_PREFIXES, prompt, "cache")
        if first is not None and first.prompt_tokens > 0:
            self._seconds_per_token = first.duration_ms / 1000.0 / first.prompt_tokens
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

    async def priority_probe(self, max_model_len: int | None) -> None:
        """The queue probe (module docstring), a round of each size while it cannot tell,
        within ``QUEUE_PROBE_BUDGET_S``; its verdict stands over a declaration."""
        if self._tokens_per_word is None or self._priority <= LIVE_PRIORITY:
            return  # no sizing, or replay's priority is not below a live one: nothing to see
        try:
            async with asyncio.timeout(QUEUE_PROBE_BUDGET_S):
                await self._priority_rounds(max_model_len)
        except TimeoutError:
            self._unclear_queue = (
                f"it did not finish within {QUEUE_PROBE_BUDGET_S:.0f}s: a busy engine runs "
                "replay-priority prompts last"
            )
        except _QueueProbeFailed as exc:
            self._unclear_queue = str(exc)

    async def _priority_rounds(self, max_model_len: int | None) -> None:
        assert self._tokens_per_word is not None
        for attempt, round_tokens in enumerate(QUEUE_PROBE_ROUND_TOKENS):
            # without a max_model_len, no larger prompts than the cache probe's
            target_tokens = PROBE_TOKENS_MAX
            if max_model_len is not None:
                target_tokens = min(round_tokens, int(max_model_len * 0.9))
            if self._seconds_per_token is not None:
                paced = QUEUE_ROUND_S / self._seconds_per_token / QUEUE_PROBE_REQUESTS
                target_tokens = min(target_tokens, int(paced))
            if target_tokens < QUEUE_PROBE_TOKENS_MIN:
                self._unclear_queue = (
                    f"not run: the engine prefills too slowly for a queue of "
                    f"{QUEUE_PROBE_REQUESTS} prompts within {QUEUE_ROUND_S:.0f}s"
                )
                return
            words = max(1, int(target_tokens / self._tokens_per_word))
            verdict, timings = await self._queue_round(words, attempt)
            if verdict == "passed":
                self._record(PRIORITY_SCHEDULING, "passed")
                return
            if verdict == "failed":
                self._record(
                    PRIORITY_SCHEDULING,
                    "failed",
                    f"serves first-come-first-served ({timings}): replay would delay live "
                    "requests; start it with --scheduling-policy priority",
                )
                return
            self._unclear_queue = timings

    async def _queue_round(self, words: int, attempt: int) -> tuple[CheckVerdict, str]:
        """One queue of replay-priority prompts (fresh salts and texts: nothing cached), then
        the live-priority one; ``_QueueProbeFailed`` when a probe is refused or fails (a
        refused priority is recorded as failed)."""
        loop = asyncio.get_running_loop()
        answered: dict[int, float] = {}

        async def queued(index: int) -> None:
            offset = (attempt + 1) * QUEUE_PROBE_REQUESTS + index  # no prompt another's prefix
            await self._queue_probe(_words_prompt(words, offset), f"queue-{attempt}-{index}")
            answered[index] = loop.time()

        live = _words_prompt(QUEUE_PROBE_LIVE_WORDS, offset=attempt)
        live_tag = f"live-{attempt}"
        tasks = [asyncio.create_task(queued(i)) for i in range(QUEUE_PROBE_REQUESTS)]
        try:
            first, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in first:
                task.result()  # a refused or failed probe ends the probe here
            waiting = [i for i, task in enumerate(tasks) if not task.done()]
            sent_s = loop.time()
            await self._queue_probe(live, live_tag, LIVE_PRIORITY)
            live_s = loop.time() - sent_s
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        round_trips = []
        for _ in range(2):  # the same short prompt alone, cached: the server's own pace
            started_s = loop.time()
            await self._queue_probe(live, live_tag, LIVE_PRIORITY)
            round_trips.append(loop.time() - started_s)
        queued_s = [answered[i] - sent_s for i in waiting]
        timings = (
            f"a live-priority prompt answered {live_s:.3f}s after it joined "
            f"{len(waiting)} replay-priority prompts of {words} words, the last of them "
            f"answered after {max(queued_s, default=0.0):.3f}s, a round trip alone "
            f"{min(round_trips):.3f}s"
        )
        return judge_queue(live_s, queued_s, min(round_trips)), timings

    async def _queue_probe(
        self, prompt: ChatPrompt, tag: str, priority: int | None = None
    ) -> PrefillOutcome:
        """One prompt of the priority probe. A refused ``priority`` fails the check; any other
        refusal or failure only ends the probe (``_QueueProbeFailed``): a gateway's limit or an
        overloaded engine says nothing of its scheduling policy."""
        request = self._request(prompt, tag, self._priority if priority is None else priority)
        try:
            return await self._prefill(request, REPLAY_TOOL_CHOICE)
        except EngineRejectedRequest as exc:
            self._note_refused_priority(exc)
            raise _QueueProbeFailed(f"a probe was refused: {exc.message[:200]}") from exc
        except (EngineUnavailable, ModelRevisionMismatch) as exc:
            raise _QueueProbeFailed(f"a probe failed: {exc.message[:200]}") from exc

    def _note_refused_priority(self, exc: EngineRejectedRequest) -> None:
        """A refusal that names the priority: an older vLLM, without priority scheduling."""
        if "priority" in exc.message.lower():
            self._record(
                PRIORITY_SCHEDULING,
                "failed",
                "refuses request priorities: start it with --scheduling-policy "
                f"priority ({exc.message[:200]})",
            )

    def priority_declared(self, declared: bool) -> None:
        if declared:
            self._record(PRIORITY_SCHEDULING, "passed")
            return
        observed = (
            f"the queue probe could not tell ({self._unclear_queue}): "
            if self._unclear_queue
            else ""
        )
        self._record(
            PRIORITY_SCHEDULING,
            "unverified",
            f"{observed}start it with --scheduling-policy priority and declare that "
            "(--declare-priority-scheduling); until then replay takes a smaller share of "
            "its spare, only while no live request is in it",
        )

    async def _probe(self, name: str, prompt: ChatPrompt, tag: str) -> PrefillOutcome | None:
        """One probe for check ``name``: its outcome, or None when refused (recorded)."""
        request = self._request(prompt, tag, self._priority)
        try:
            return await self._prefill(request, REPLAY_TOOL_CHOICE)
        except EngineRejectedRequest as exc:
            self._note_refused_priority(exc)
            self._record(name, "failed", _refusal_reason(name, exc.message))
            return None
        except (EngineUnavailable, ModelRevisionMismatch) as exc:
            self._stop(name, exc)

    def _stop(self, name: str, exc: EngineUnavailable | ModelRevisionMismatch) -> NoReturn:
        failed = SERVES_REVISION if isinstance(exc, ModelRevisionMismatch) else name
        self._found.pop(failed, None)  # a 404 now outranks the model list's earlier pass
        self._record(failed, "failed", exc.message)
        raise _Stop from exc

    def _request(self, prompt: ChatPrompt, tag: str, priority: int) -> PrefillRequest:
        self._sent += 1
        return PrefillRequest(
            self._revision,
            prompt,
            f"{self._salt}-{tag}",
            priority,
            f"check-{self._salt[:8]}-{self._sent}",
        )


def _words_prompt(words: int, offset: int = 0) -> ChatPrompt:
    text = " ".join(f"probe{(offset + i) % 101}" for i in range(words))
    return ChatPrompt(({"role": "user", "content": text},))


def _refusal_reason(name: str, message: str) -> str:
    hints = {
        ACCEPTS_TOOLS: "refuses replay's tool-using request",
        ACCEPTS_CHAT_TEMPLATE: "refuses a conversation's stored chat template: start it with "
        "--trust-request-chat-template",
        CACHES_PREFIXES: "refuses the cache probe",
    }
    return f"{hints.get(name, 'refuses a probe')} ({message[:300]})"

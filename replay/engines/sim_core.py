"""Pure core of the simulated inference engine: tokenizer, block prefix cache, prefill server.

This is a *simulator* (no GPU, no model). It exists so that demos, tests and capacity benches can
run the replay machinery against something with the timing and caching behaviour of vLLM:

Tokenizer (``sim_tokenize``)
    Deterministic and model-free, and faithful where replay depends on it: it tokenizes the
    *rendered* request, everything a chat template puts into the prompt, so two requests share
    a token prefix exactly when a real template would render them alike. One token per
    whitespace-separated word of the render (token id = CRC-32 of the word). The render: a
    token for the chat template (a hash of it) when one is given, one for the template kwargs
    when given, the ``tools`` as canonical JSON between ``<|tools|>`` markers; then per message
    a start marker and the role, the content's words (text parts in order; an image or audio
    part as one token hashing its data), each tool call's id, name and argument words, a tool
    result's ``tool_call_id``, and an end marker; last the assistant generation prompt (2
    tokens). So ``[user: "hello world"]`` is 2 + 2 + 1 + 2 = 7 tokens.

Prefix cache (``PrefixCache``)
    vLLM's automatic prefix caching: the prompt is cut into 16-token blocks; a block's key is
    ``hash(parent key, cache-salt key, block tokens)`` (a chain, so a block matches only with the
    same whole prefix and the same salt: tenants never share entries). Only full blocks are
    cached. Lookup returns the longest cached prefix; capacity is in tokens (whole blocks), and
    the least recently used block is evicted first. As in vLLM, the last prompt token is always
    computed, and a hit counts whole blocks only, so ``cached_tokens`` is at most
    ``(prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS``: a prompt of whole blocks computes
    its last block again.

Prefill server (``PrefillServerModel``), scheduled like vLLM V1's scheduler
    One prefill pipeline with ``prefill_tokens_per_s`` capacity, run in scheduler steps with
    chunked prefill: a step has a token budget of ``chunk_tokens`` (``max_num_batched_tokens``).
    **Running requests are scheduled first**, in the order they started, each taking
    ``min(remaining, budget left)``; only the budget they leave goes to waiting requests, taken
    by priority (lower value first, FIFO within a priority) under ``--scheduling-policy
    priority``, or by arrival ignoring priority under ``fcfs``, while fewer than
    ``max_num_seqs`` run. So a low-priority replay already running in chunks keeps its budget
    ahead of a live request that arrives later: the live request waits for whatever budget
    the running chunks leave, up to the replay's whole remaining prefill when it fills the
    budget (size replay requests with that in mind). A step lasts its tokens / rate. The
    prefix-cache lookup happens when a request is first scheduled; its blocks enter the cache
    when its prefill completes. TTFT = queueing + the request's steps (max_tokens=1: no
    decode is modelled; one generation token is counted per request).

Metrics (``metrics`` and ``counters``), counted when vLLM V1 counts them
    ``num_requests_running``: scheduled at least once and not finished; ``num_requests_waiting``:
    never scheduled yet. Prefix-cache queries and hits are counted when a request is first
    *scheduled* (vLLM's KV cache manager records them there); prompt tokens, and the prompt
    tokens by source (``local_compute``, ``local_cache_hit``), when its prefill completes
    (``IterationStats`` adds them with the first output token). So under chunked prefill hits
    run ahead of prompt tokens and ``prompt - hits`` can go down between two scrapes: the
    live-demand series is the ``local_compute`` one. TTFT goes into vLLM's histogram buckets.
    ``cached_tokens`` is reported in usage only with ``prompt_tokens_details`` (vLLM's
    ``--enable-prompt-tokens-details``).

Everything here is plain state driven by the caller's clock readings (``now_s``): no I/O, no
asyncio, so the same model runs in real time (the HTTP simulator) and in virtual time (benches).
"""

from __future__ import annotations

import hashlib
import heapq
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from eventlog.errors import InvariantViolation
from replay.chat import ChatPrompt, canonical_json
from replay.drill_tally import TTFT_BUCKETS_S, bucket_index, ttft_buckets
from replay.engines.base import EngineUnavailable
from replay.model import EngineMetrics

BLOCK_TOKENS = 16

_START = "<|start|>"
_END = "<|end|>"


def sim_tokenize(prompt: ChatPrompt) -> list[int]:
    """The simulator's deterministic tokenizer over the rendered prompt (module docstring)."""
    return [zlib.crc32(word.encode()) for word in _render_words(prompt)]


def _render_words(prompt: ChatPrompt) -> list[str]:
    words: list[str] = []
    if prompt.chat_template is not None:
        words.append(f"<|template:{_digest(prompt.chat_template)}|>")
    if prompt.chat_template_kwargs:
        words.append(f"<|kwargs:{_digest(canonical_json(prompt.chat_template_kwargs))}|>")
    if prompt.tools:
        words.extend(["<|tools|>", *canonical_json(list(prompt.tools)).split(), "<|/tools|>"])
    for message in prompt.messages:
        words.extend([_START, str(message.get("role"))])
        words.extend(_content_words(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            words.extend(["<|tool_call|>", str(call.get("id")), str(function.get("name"))])
            words.extend(str(function.get("arguments", "")).split())
        if "tool_call_id" in message:
            words.extend(["<|tool_result|>", str(message["tool_call_id"])])
        words.append(_END)
    words.extend([_START, "assistant"])
    return words


def _content_words(content: object) -> list[str]:
    if isinstance(content, str):
        return content.split()
    words: list[str] = []
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            words.extend(str(part.get("text", "")).split())
        elif kind is not None:
            words.append(f"<|{kind}:{_digest(canonical_json(part))}|>")
    return words


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def salt_key(cache_salt: str) -> int:
    """A stable 64-bit key for a cache salt (stable across processes, unlike ``hash(str)``)."""
    return int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest(), "big")


def block_keys(tokens: Sequence[int], cache_salt: str) -> list[int]:
    """Chained keys of the prompt's full blocks. Tuples of ints hash deterministically."""
    keys: list[int] = []
    parent = salt_key(cache_salt)
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = hash((parent, *tokens[start : start + BLOCK_TOKENS]))
        keys.append(parent)
    return keys


class PrefixCache:
    """LRU set of block keys, capacity in tokens (rounded down to whole blocks).

    Every use stamps the blocks from a monotone counter, root first with the highest stamp, so
    along any chain a parent is never older than its child: eviction (oldest first) takes a
    prompt's tail before its head, as vLLM frees a request's blocks in reverse order, and the
    cached set stays prefix-closed. That makes ``lookup`` a binary search (O(log n) dict probes)
    and lets stamping run as one C-level ``dict.update``. Eviction is exact LRU: a sorted
    snapshot of stamps is consumed oldest first, entries re-stamped since the snapshot are
    skipped (they are newer than every entry still in it), and it is rebuilt when used up, so
    each block costs O(log n) amortized instead of a move per block per request.
    """

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise InvariantViolation("cache capacity must be >= 0")
        self.capacity_blocks = capacity_tokens // BLOCK_TOKENS
        self._stamps: dict[int, int] = {}
        self._clock = 0
        self._eviction_order: list[tuple[int, int]] = []  # (stamp, key), newest first
        self.evicted_blocks_total = 0

    def __len__(self) -> int:
        return len(self._stamps)

    def __contains__(self, key: int) -> bool:
        return key in self._stamps

    def lookup(self, keys: Sequence[int]) -> int:
        """Number of leading blocks that are cached; touches them (most recently used)."""
        low, high = 0, len(keys)  # invariant: keys[:low] cached, keys[high:] not
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in self._stamps:
                low = middle
            else:
                high = middle - 1
        self._touch(keys, low)
        return low

    def insert(self, keys: Sequence[int]) -> None:
        self._touch(keys, len(keys))
        excess = len(self._stamps) - self.capacity_blocks
        while excess > 0:
            if not self._eviction_order:
                self._eviction_order = sorted(
                    ((stamp, key) for key, stamp in self._stamps.items()), reverse=True
                )
            stamp, key = self._eviction_order.pop()
            if self._stamps.get(key) == stamp:
                del self._stamps[key]
                self.evicted_blocks_total += 1
                excess -= 1

    def _touch(self, keys: Sequence[int], count: int) -> None:
        top = self._clock + count
        self._stamps.update(zip(keys[:count], range(top, self._clock, -1), strict=True))
        self._clock = top


SchedulingPolicy = Literal["priority", "fcfs"]


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    prefill_tokens_per_s: float = 20_000.0
    cache_tokens: int = 1_000_000
    chunk_tokens: int = 512  # token budget of one scheduler step (max_num_batched_tokens)
    queue_max: int = 4096  # requests queued or in progress; beyond it a submit is refused
    max_num_seqs: int = 256  # requests running at once (and so in one step)
    #: ``--scheduling-policy``: "priority" orders waiting requests by priority; "fcfs" (vLLM's
    #: default) by arrival, ignoring ``priority``
    scheduling_policy: SchedulingPolicy = "priority"
    #: ``--enable-prompt-tokens-details``: only then is ``cached_tokens`` reported in usage
    prompt_tokens_details: bool = True
    #: ``--max-model-len``: a prompt that leaves no room for one output token is refused
    max_model_len: int = 131_072
    #: ``--trust-request-chat-template``: without it a request's own template is refused
    trust_request_chat_template: bool = True
    #: ``--enable-auto-tool-choice --tool-call-parser``: without them the HTTP face refuses
    #: ``tools`` under ``tool_choice`` "auto" (the default when tools are sent)
    enable_auto_tool_choice: bool = True
    #: ``--exclude-tools-when-tool-choice-none``: under "none" the tools leave the prompt
    exclude_tools_when_tool_choice_none: bool = False
    #: False = ``--disable-log-stats``: ``/metrics`` exports no ``vllm:`` series
    log_stats: bool = True


@dataclass(frozen=True, slots=True)
class SimCompletion:
    ticket: int
    priority: int
    prompt_tokens: int
    cached_tokens: int
    arrival_s: float
    first_chunk_s: float
    finish_s: float

    @property
    def ttft_s(self) -> float:
        return self.finish_s - self.arrival_s


@dataclass(slots=True)
class _Pending:
    ticket: int
    priority: int
    arrival_s: float
    keys: Sequence[int]
    prompt_tokens: int
    cached_tokens: int = 0
    remaining_tokens: int = -1  # -1: not scheduled yet (cache not looked up yet)
    first_chunk_s: float = 0.0
    step_tokens: int = 0  # tokens in the step in progress


@dataclass(slots=True)
class SimCounters:
    """What the engine exposes, counted when vLLM V1 counts it (the module docstring)."""

    prompt_tokens_total: int = 0  # at a request's first output (its prefill completed)
    computed_prompt_tokens_total: int = 0  # by source local_compute, with prompt tokens
    cached_prompt_tokens_total: int = 0  # by source local_cache_hit, with prompt tokens
    prefix_cache_queries_total: int = 0  # at a request's first scheduling
    prefix_cache_hits_total: int = 0  # at a request's first scheduling
    requests_total: int = 0  # one generated token each
    ttft_bucket_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    ttft_sum_s: float = 0.0


class PrefillServerModel:
    """The step-batched, chunked-prefill server with vLLM V1's scheduling order (module
    docstring): running requests first, then waiting ones by policy."""

    def __init__(self, config: SimEngineConfig) -> None:
        if config.prefill_tokens_per_s <= 0 or config.chunk_tokens <= 0 or config.max_num_seqs <= 0:
            raise InvariantViolation("prefill rate, step budget and max_num_seqs must be positive")
        self.config = config
        self.cache = PrefixCache(config.cache_tokens)
        self._waiting: list[tuple[int, int, _Pending]] = []  # (priority or 0, ticket, request)
        self._running: list[_Pending] = []  # scheduled at least once, in scheduling order
        self._step: list[_Pending] = []  # the requests of the step in progress
        self._step_end_s = 0.0
        self._now_s = 0.0
        self._next_ticket = 0
        self._done: list[SimCompletion] = []
        self.counters = SimCounters()
        self.computed_tokens_total = 0  # every computed token, at the end of its step
        self.busy_s_total = 0.0

    # --- inputs ------------------------------------------------------------------------------

    def submit(self, tokens: Sequence[int], cache_salt: str, priority: int, now_s: float) -> int:
        """Queue a prefill of ``tokens``; returns its ticket. Raises EngineUnavailable if full."""
        return self.submit_blocks(block_keys(tokens, cache_salt), len(tokens), priority, now_s)

    def submit_blocks(
        self, keys: Sequence[int], prompt_tokens: int, priority: int, now_s: float
    ) -> int:
        """``submit`` with the prompt's block keys already computed (``block_keys``): benches
        keep them per conversation and extend them turn by turn instead of rehashing."""
        self.advance(now_s)
        if prompt_tokens <= 0 or len(keys) > prompt_tokens // BLOCK_TOKENS:
            raise InvariantViolation("a prompt has at least one token and whole-block keys")
        if self.in_system >= self.config.queue_max:
            raise EngineUnavailable("simulated engine queue is full", retry_after_s=1.0)
        ticket = self._next_ticket
        self._next_ticket += 1
        pending = _Pending(ticket, priority, now_s, keys, prompt_tokens)
        order = priority if self.config.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (order, ticket, pending))
        if not self._step:
            self._start_step(now_s)
        return ticket

    def advance(self, now_s: float) -> None:
        """Run the server up to ``now_s``; finished requests go to ``pop_completed``."""
        if now_s < self._now_s:
            raise InvariantViolation(f"time went backwards: {now_s} < {self._now_s}")
        while self._step and self._step_end_s <= now_s:
            self._finish_step()
        self._now_s = now_s

    def pop_completed(self) -> list[SimCompletion]:
        done, self._done = self._done, []
        return done

    # --- observations ------------------------------------------------------------------------

    def next_event_s(self) -> float | None:
        """When the step in progress ends (None when idle)."""
        return self._step_end_s if self._step else None

    @property
    def in_system(self) -> int:
        return len(self._waiting) + len(self._running)

    def metrics(self) -> EngineMetrics:
        c = self.counters
        return EngineMetrics(
            prompt_tokens_total=float(c.prompt_tokens_total),
            generation_tokens_total=float(c.requests_total),
            num_requests_running=float(len(self._running)),
            num_requests_waiting=float(len(self._waiting)),
            prefix_cache_queries_total=float(c.prefix_cache_queries_total),
            prefix_cache_hits_total=float(c.prefix_cache_hits_total),
            computed_prompt_tokens_total=float(c.computed_prompt_tokens_total),
            kv_cache_usage_perc=len(self.cache) / max(self.cache.capacity_blocks, 1),
            ttft_buckets=ttft_buckets(c.ttft_bucket_counts, c.requests_total),
        )

    # --- the server --------------------------------------------------------------------------

    def _start_step(self, start_s: float) -> None:
        budget = self.config.chunk_tokens
        step: list[_Pending] = []
        for pending in self._running:  # running first, in order: they keep their budget
            if budget <= 0:
                break
            pending.step_tokens = min(budget, pending.remaining_tokens)
            budget -= pending.step_tokens
            step.append(pending)
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            _, _, pending = heapq.heappop(self._waiting)
            self._first_schedule(pending, start_s)
            pending.step_tokens = min(budget, pending.remaining_tokens)
            budget -= pending.step_tokens
            step.append(pending)
        self._step = step
        if step:
            duration_s = (self.config.chunk_tokens - budget) / self.config.prefill_tokens_per_s
            self._step_end_s = start_s + duration_s
            self.busy_s_total += duration_s

    def _first_schedule(self, pending: _Pending, start_s: float) -> None:
        hit_blocks = self.cache.lookup(pending.keys)
        # at most the whole blocks before the last token, which vLLM always computes
        usable_blocks = min(hit_blocks, (pending.prompt_tokens - 1) // BLOCK_TOKENS)
        pending.cached_tokens = usable_blocks * BLOCK_TOKENS
        pending.remaining_tokens = pending.prompt_tokens - pending.cached_tokens
        pending.first_chunk_s = start_s
        self._running.append(pending)
        # vLLM records prefix-cache stats when the KV cache manager schedules the request
        self.counters.prefix_cache_queries_total += pending.prompt_tokens
        self.counters.prefix_cache_hits_total += pending.cached_tokens

    def _finish_step(self) -> None:
        step, self._step = self._step, []
        end_s = self._step_end_s
        finished = False
        for pending in step:
            pending.remaining_tokens -= pending.step_tokens
            self.computed_tokens_total += pending.step_tokens
            if pending.remaining_tokens <= 0:
                self._complete(pending, end_s)
                finished = True
        if finished:
            self._running = [p for p in self._running if p.remaining_tokens > 0]
        self._start_step(end_s)

    def _complete(self, pending: _Pending, end_s: float) -> None:
        self.cache.insert(pending.keys)
        c = self.counters
        # counted with the first output token, as vLLM V1's IterationStats does
        c.prompt_tokens_total += pending.prompt_tokens
        c.computed_prompt_tokens_total += pending.prompt_tokens - pending.cached_tokens
        c.cached_prompt_tokens_total += pending.cached_tokens
        c.requests_total += 1
        ttft_s = end_s - pending.arrival_s
        c.ttft_sum_s += ttft_s
        index = bucket_index(ttft_s)
        if index is not None:
            c.ttft_bucket_counts[index] += 1
        self._done.append(
            SimCompletion(
                pending.ticket,
                pending.priority,
                pending.prompt_tokens,
                pending.cached_tokens,
                pending.arrival_s,
                pending.first_chunk_s,
                end_s,
            )
        )

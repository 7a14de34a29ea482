"""Pure core of the simulated inference engine: tokenizer, block prefix cache, prefill server.

This is a *simulator* (no GPU, no model). It exists so that demos, tests and capacity benches can
run the replay machinery against something with the timing and caching behaviour of vLLM:

Tokenizer (``sim_tokenize``)
    Deterministic and model-free: one token per whitespace-separated word (token id = CRC-32 of
    the word), framed like a chat template: every message adds 2 tokens before its words (start
    marker, role) and 1 after (end marker), and the prompt ends with 2 tokens (the assistant
    generation prompt). So ``[user: "hello world"]`` is 2 + 2 + 1 + 2 = 7 tokens.

Prefix cache (``PrefixCache``)
    vLLM's automatic prefix caching: the prompt is cut into 16-token blocks; a block's key is
    ``hash(parent key, cache-salt key, block tokens)`` (a chain, so a block matches only with the
    same whole prefix and the same salt: tenants never share entries). Only full blocks are
    cached. Lookup returns the longest cached prefix; capacity is in tokens (whole blocks), and
    the least recently used block is evicted first. As in vLLM, at least the last prompt token
    is always computed, so ``cached_tokens <= prompt_tokens - 1``.

Prefill server (``PrefillServerModel``)
    One prefill pipeline with ``prefill_tokens_per_s`` capacity. Requests queue in priority
    order (lower value first, FIFO within a priority: vLLM's ``--scheduling-policy priority``),
    and the server works in chunks of at most ``chunk_tokens`` (vLLM's chunked prefill). After
    every chunk it picks again, so a live request (priority 0) that arrives behind a replay
    request (high priority value) waits at most one replay chunk. The prefix-cache lookup happens
    when a request gets its first chunk; its blocks enter the cache when its prefill completes.
    TTFT = queueing + the request's own chunks (max_tokens=1: no decode is modelled; one
    generation token is counted per request).

Everything here is plain state driven by the caller's clock readings (``now_s``): no I/O, no
asyncio, so the same model runs in real time (the HTTP simulator) and in virtual time (benches).
"""

from __future__ import annotations

import hashlib
import heapq
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from eventlog.errors import InvariantViolation
from replay.engines.base import EngineUnavailable
from replay.model import ChatMessage, EngineMetrics

BLOCK_TOKENS = 16

_START = zlib.crc32(b"<|start|>")
_END = zlib.crc32(b"<|end|>")


def sim_tokenize(messages: Sequence[ChatMessage]) -> list[int]:
    """The simulator's deterministic tokenizer (see the module docstring)."""
    tokens: list[int] = []
    for message in messages:
        tokens.append(_START)
        tokens.append(zlib.crc32(message.role.encode()))
        tokens.extend(zlib.crc32(word.encode()) for word in message.content.split())
        tokens.append(_END)
    tokens.append(_START)
    tokens.append(zlib.crc32(b"assistant"))
    return tokens


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
    """LRU set of block keys, capacity in tokens (rounded down to whole blocks)."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise InvariantViolation("cache capacity must be >= 0")
        self.capacity_blocks = capacity_tokens // BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.evicted_blocks_total = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, keys: Sequence[int]) -> int:
        """Number of leading blocks that are cached; touches them (most recently used)."""
        hits = 0
        for key in keys:
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hits += 1
        return hits

    def insert(self, keys: Sequence[int]) -> None:
        for key in keys:
            if key in self._blocks:
                self._blocks.move_to_end(key)
            else:
                self._blocks[key] = None
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evicted_blocks_total += 1


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    prefill_tokens_per_s: float = 20_000.0
    cache_tokens: int = 1_000_000
    chunk_tokens: int = 512
    queue_max: int = 4096  # requests queued or in progress; beyond it a submit is refused


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
    remaining_tokens: int = -1  # -1: not started (cache not looked up yet)
    first_chunk_s: float = 0.0


class PrefillServerModel:
    """The chunked, priority-scheduled prefill server (see the module docstring)."""

    def __init__(self, config: SimEngineConfig) -> None:
        if config.prefill_tokens_per_s <= 0 or config.chunk_tokens <= 0:
            raise InvariantViolation("prefill rate and chunk size must be positive")
        self.config = config
        self.cache = PrefixCache(config.cache_tokens)
        self._queue: list[tuple[int, int, _Pending]] = []  # (priority, ticket, request)
        self._current: _Pending | None = None
        self._chunk_tokens_now = 0
        self._chunk_end_s = 0.0
        self._now_s = 0.0
        self._next_ticket = 0
        self._started_unfinished = 0
        self._done: list[SimCompletion] = []
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.computed_tokens_total = 0
        self.requests_total = 0
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
        heapq.heappush(self._queue, (priority, ticket, pending))
        if self._current is None:
            self._start_next_chunk(now_s)
        return ticket

    def advance(self, now_s: float) -> None:
        """Run the server up to ``now_s``; finished requests go to ``pop_completed``."""
        if now_s < self._now_s:
            raise InvariantViolation(f"time went backwards: {now_s} < {self._now_s}")
        while self._current is not None and self._chunk_end_s <= now_s:
            self._finish_chunk()
        self._now_s = now_s

    def pop_completed(self) -> list[SimCompletion]:
        done, self._done = self._done, []
        return done

    # --- observations ------------------------------------------------------------------------

    def next_event_s(self) -> float | None:
        """When the chunk in progress ends (None when idle)."""
        return self._chunk_end_s if self._current is not None else None

    @property
    def in_system(self) -> int:
        return len(self._queue) + (1 if self._current is not None else 0)

    def metrics(self) -> EngineMetrics:
        running = self._started_unfinished
        return EngineMetrics(
            prompt_tokens_total=float(self.prompt_tokens_total),
            generation_tokens_total=float(self.requests_total),
            num_requests_running=float(running),
            num_requests_waiting=float(self.in_system - running),
            prefix_cache_queries_total=float(self.prompt_tokens_total),
            prefix_cache_hits_total=float(self.cached_tokens_total),
        )

    # --- the server --------------------------------------------------------------------------

    def _start_next_chunk(self, start_s: float) -> None:
        if not self._queue:
            self._current = None
            return
        _, _, pending = heapq.heappop(self._queue)
        if pending.remaining_tokens < 0:
            hit_blocks = self.cache.lookup(pending.keys)
            pending.cached_tokens = min(hit_blocks * BLOCK_TOKENS, pending.prompt_tokens - 1)
            pending.remaining_tokens = pending.prompt_tokens - pending.cached_tokens
            pending.first_chunk_s = start_s
            self._started_unfinished += 1
        tokens = min(self.config.chunk_tokens, pending.remaining_tokens)
        duration_s = tokens / self.config.prefill_tokens_per_s
        self._current = pending
        self._chunk_tokens_now = tokens
        self._chunk_end_s = start_s + duration_s
        self.busy_s_total += duration_s

    def _finish_chunk(self) -> None:
        pending = self._current
        if pending is None:
            raise InvariantViolation("no chunk in progress")
        end_s = self._chunk_end_s
        pending.remaining_tokens -= self._chunk_tokens_now
        self.computed_tokens_total += self._chunk_tokens_now
        if pending.remaining_tokens > 0:
            heapq.heappush(self._queue, (pending.priority, pending.ticket, pending))
        else:
            self._complete(pending, end_s)
        self._start_next_chunk(end_s)

    def _complete(self, pending: _Pending, end_s: float) -> None:
        self.cache.insert(pending.keys)
        self._started_unfinished -= 1
        self.prompt_tokens_total += pending.prompt_tokens
        self.cached_tokens_total += pending.cached_tokens
        self.requests_total += 1
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

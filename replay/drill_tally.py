"""What a region's replay keeps for a drill's LLM figures (``regions.drill_llm_metrics``). Pure.

* replay's own engine requests (a job's pieces) in vLLM's TTFT buckets (``TTFT_BUCKETS_S``), as
  the worker timed them, with the prompt tokens they queried and found cached: an engine's TTFT histogram and prefix-cache counters
  count replay's requests too, and the drill takes these off to see the live ones;
* when moved conversations turned warm (a ``replayed`` result, or a live turn that found its
  replay job still queued or running): counts per ``WARM_BUCKET_MS`` of wall time, at most
  ``WARM_BUCKETS_MAX`` buckets (the oldest go first);
* when shards moved here (this region took the lead of a shard another region led: replay of
  it can start), the latest ``MOVED_TIMES_MAX``.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replay.model import ReplayResult

#: vLLM's buckets of ``vllm:time_to_first_token_seconds`` (seconds)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
#: warm events are counted per this much wall time ...
WARM_BUCKET_MS = 100
#: ... in at most this many non-empty buckets
WARM_BUCKETS_MAX = 3000
#: shard moves remembered (a drill wants the first after its injection)
MOVED_TIMES_MAX = 64


def ttft_buckets(counts: Sequence[int], total: int) -> tuple[tuple[float, float], ...]:
    """Per-bucket counts over ``TTFT_BUCKETS_S`` -> the cumulative buckets vLLM exports, with
    ``+Inf`` (``total``) last."""
    cumulative = itertools.accumulate(counts)
    return (
        *((bound_s, float(n)) for bound_s, n in zip(TTFT_BUCKETS_S, cumulative, strict=True)),
        (math.inf, float(total)),
    )


def bucket_index(ttft_s: float) -> int | None:
    """The ``TTFT_BUCKETS_S`` bucket of one request (None: above the last bound, ``+Inf``)."""
    index = bisect.bisect_left(TTFT_BUCKETS_S, ttft_s)
    return index if index < len(TTFT_BUCKETS_S) else None


def histogram_body(buckets: Sequence[tuple[float, float]] | None) -> dict[str, Any] | None:
    """Cumulative buckets (``+Inf`` last) as JSON: finite bounds ``le`` and ``cumulative``."""
    if not buckets:
        return None
    return {
        "le": [bound_s for bound_s, _ in buckets[:-1]],
        "cumulative": [count for _, count in buckets],
    }


@dataclass(slots=True)
class DrillTally:
    replay_prompt_tokens: int = 0
    replay_cached_tokens: int = 0
    replay_requests: int = 0
    replay_ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))
    _warmed: OrderedDict[int, int] = field(default_factory=OrderedDict)
    _moved_here_ms: deque[int] = field(default_factory=lambda: deque(maxlen=MOVED_TIMES_MAX))

    def moved_here(self, at_ms: int) -> None:
        self._moved_here_ms.append(at_ms)

    def replayed(self, result: ReplayResult) -> None:
        """A ``replayed`` result: its engine requests (a result from an older worker reports
        none: its whole job counts as one request, its prompt and cached tokens as queried and
        hit)."""
        if result.request_ms:
            request_ms, queried, hit = result.request_ms, result.queried_tokens, result.hit_tokens
        else:
            request_ms = (result.duration_ms,)
            queried, hit = result.prompt_tokens, result.cached_prompt_tokens
        self.replay_requests += len(request_ms)
        self.replay_prompt_tokens += queried
        self.replay_cached_tokens += hit
        for ms in request_ms:
            index = bucket_index(ms / 1000)
            if index is not None:
                self.replay_ttft_counts[index] += 1

    def warmed(self, at_ms: int) -> None:
        bucket_ms = at_ms - at_ms % WARM_BUCKET_MS
        self._warmed[bucket_ms] = self._warmed.get(bucket_ms, 0) + 1
        if len(self._warmed) > WARM_BUCKETS_MAX:
            self._warmed.popitem(last=False)

    def to_body(self) -> dict[str, Any]:
        return {
            "replay_prompt_tokens": self.replay_prompt_tokens,
            "replay_cached_tokens": self.replay_cached_tokens,
            "replay_ttft": histogram_body(
                ttft_buckets(self.replay_ttft_counts, self.replay_requests)
            ),
            "warmed": [[ms, n] for ms, n in sorted(self._warmed.items())],
            "moved_here_ms": list(self._moved_here_ms),
        }

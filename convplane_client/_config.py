"""The client's limits, each named with its unit, and the clock it waits on (injected, so tests
run on virtual time)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ClientConfig:
    #: requests one call may send in all, its first included (the retry budget)
    attempts_max: int = 8
    #: a call's deadline when the caller gives none: no retry starts after it
    deadline_s: float = 30.0
    #: one request's timeout (connect, read, write), and the budget sent in
    #: X-Convplane-Deadline-Ms (less when the call's deadline is nearer)
    request_timeout_s: float = 10.0
    #: first backoff between retries; doubles per retry up to ``backoff_max_s``, jittered
    backoff_base_s: float = 0.05
    backoff_max_s: float = 2.0
    #: how long a region that did not answer is passed over for another
    region_unreachable_s: float = 2.0
    #: conversations whose serving region the routing table remembers (least recently used
    #: forgotten first; a forgotten one is asked again)
    routes_max: int = 10_000
    #: ask ``GET .../route`` before a conversation's first request (else its first request goes
    #: to any region, which forwards it, and the answer's X-Convplane-Served-By teaches the route)
    resolve_routes: bool = True
    #: pages ``transcript`` reads at most (each at most ``page_events_max`` events)
    transcript_pages_max: int = 10_000
    page_events_max: int = 1000

    def __post_init__(self) -> None:
        if self.attempts_max < 1:
            raise ValueError("attempts_max must be at least 1")
        if min(self.deadline_s, self.request_timeout_s) <= 0:
            raise ValueError("deadline_s and request_timeout_s must be positive")
        if not 0 <= self.backoff_base_s <= self.backoff_max_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        if self.routes_max < 1 or self.transcript_pages_max < 1:
            raise ValueError("routes_max and transcript_pages_max must be at least 1")
        if not 1 <= self.page_events_max <= 1000:
            raise ValueError("page_events_max must be 1..1000 (the plane's page limit)")


class Clock(Protocol):
    """Monotonic time and the two ways to wait: the sync client sleeps, the async one awaits."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    async def sleep_async(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def sleep_async(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

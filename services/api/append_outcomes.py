"""Appends that entered this node and how they ended, over a sliding window: the console's
per-region append rate and error ratio, without a Prometheus server in the loop.

``OutcomeWindow`` is pure (time is an argument): one bucket per second, ``window_s`` buckets,
so its memory is fixed whatever the rate. ``AppendOutcomes`` reads the node's clock for it (from
``open``, in the lifespan), and ``AppendOutcomeMiddleware`` feeds it from the edge of the app: every ``POST /v1/conversations/{id}/events`` that entered here (a forward from another
node, ``X-Convplane-Forwarded``, was counted at its entry node and is not counted again),
including those refused before a handler ran (admission's 429/503/504). An *error* is a 5xx
(``no_quorum``, ``overloaded``, ``outcome_unknown``, ``deadline_exceeded``...): the region
failed the client. 4xx answers are the client's own mistakes or conflicts and are counted as
neither success nor error.

It lives at the edge (``services.api``), where appends are answered (the fast lane and the
middleware write it); the console, a layer above, reads it.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from eventlog.clock import Clock
from eventlog.errors import InvariantViolation
from eventlog.http_headers import FORWARDED_HEADER_RAW

#: the window the console's rates are averaged over
APPEND_WINDOW_S = 10
_APPEND_PATH = re.compile(r"^/v1/conversations/[^/]+/events/?$")


@dataclass(frozen=True, slots=True)
class AppendRates:
    window_s: int
    received_per_s: float
    succeeded_per_s: float
    errors_per_s: float
    #: errors / (successes + errors); None while no append ended either way in the window
    error_ratio: float | None

    def to_body(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "received_per_s": round(self.received_per_s, 2),
            "succeeded_per_s": round(self.succeeded_per_s, 2),
            "errors_per_s": round(self.errors_per_s, 2),
            "error_ratio": None if self.error_ratio is None else round(self.error_ratio, 4),
        }


class OutcomeWindow:
    """Counts of received / succeeded / failed appends per whole second of ``now_s``."""

    def __init__(self, window_s: int = APPEND_WINDOW_S) -> None:
        if window_s < 1:
            raise InvariantViolation("the outcome window needs at least one second")
        self.window_s = window_s
        # bucket index -> (second it holds, received, succeeded, errors)
        self._buckets: list[tuple[int, int, int, int]] = [(-1, 0, 0, 0)] * window_s

    def record(self, now_s: float, status: int) -> None:
        second = int(now_s)
        index = second % self.window_s
        held, received, succeeded, errors = self._buckets[index]
        if held != second:
            received = succeeded = errors = 0
        self._buckets[index] = (
            second,
            received + 1,
            succeeded + (1 if 200 <= status < 300 else 0),
            errors + (1 if status >= 500 else 0),
        )

    def rates(self, now_s: float) -> AppendRates:
        """Rates over the last ``window_s`` whole seconds, the current one included."""
        oldest = int(now_s) - self.window_s + 1
        received = succeeded = errors = 0
        for held, r, s, e in self._buckets:
            if held >= oldest:
                received, succeeded, errors = received + r, succeeded + s, errors + e
        ended = succeeded + errors
        return AppendRates(
            window_s=self.window_s,
            received_per_s=received / self.window_s,
            succeeded_per_s=succeeded / self.window_s,
            errors_per_s=errors / self.window_s,
            error_ratio=errors / ended if ended else None,
        )


class AppendOutcomes:
    """An ``OutcomeWindow`` on the node's clock, known from ``open`` on (nothing is served
    before the lifespan opens it)."""

    def __init__(self, window_s: int = APPEND_WINDOW_S) -> None:
        self.window = OutcomeWindow(window_s)
        self._clock: Clock | None = None

    def open(self, clock: Clock) -> None:
        self._clock = clock

    def record(self, status: int) -> None:
        if self._clock is not None:
            self.window.record(self._clock.monotonic(), status)

    def rates(self) -> AppendRates:
        return self.window.rates(self._clock.monotonic() if self._clock is not None else 0.0)

    def succeeded_and_errors(self) -> tuple[float, float]:
        """Per second over the window: appends answered 2xx, and answered 5xx."""
        rates = self.rates()
        return rates.succeeded_per_s, rates.errors_per_s


class AppendOutcomeMiddleware:
    """Records the status of every append that entered this node (the module docstring)."""

    def __init__(self, app: ASGIApp, *, outcomes: AppendOutcomes) -> None:
        self.app = app
        self.outcomes = outcomes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_entering_append(scope):
            await self.app(scope, receive, send)
            return
        status = [500]  # an exception that escapes the app is a 500 to the client

        async def watched(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.outcomes.record(status[0])


def _is_entering_append(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    if not _APPEND_PATH.match(scope["path"]):
        return False
    return not any(key == FORWARDED_HEADER_RAW for key, _ in scope.get("headers", ()))

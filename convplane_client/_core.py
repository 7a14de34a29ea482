"""The client's sans-IO core: one request's life (routing, retries, backoff, deadlines) as a
generator that *yields* what it wants done and is *sent* what happened. The sync and async
clients drive the same generators (``sync.py``, ``aio.py``), so neither holds any of the logic.

A plan yields:

- ``Send(request, region)``: send it; the plan is sent the ``httpx.Response`` (body read) or
  the ``httpx.TransportError`` that came instead;
- ``Sleep(seconds)``: wait on the injected clock; sent None;
- ``RunTool(fn, attempt_id)``: call the application's tool; sent its result, or ``Raised``.

Every call the client makes is safe to send again, which is what lets the core retry any
failure the plane calls retryable and any request that got no answer: appends always carry an
``Idempotency-Key`` (generated when the caller gives none), a create always names its
conversation (generated likewise; creating it again with the same body returns it), tool events
are identified by their ``attempt_id``, and the rest are reads.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from convplane_client._config import ClientConfig, Clock
from convplane_client._errors import (
    ConvplaneError,
    DeadlineExceeded,
    NotLeader,
    TransportFailed,
    error_from_response,
)
from convplane_client._headers import DEADLINE_HEADER, IDEMPOTENCY_KEY_HEADER, SERVED_BY_HEADER
from convplane_client._routing import RegionUrls, RoutingTable

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    request: httpx.Request
    region: str


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class RunTool:
    fn: Callable[[str], Any]
    attempt_id: str


@dataclass(frozen=True)
class Raised:
    """What a tool raised, handed back to the plan (which decides whether to record it)."""

    error: Exception


Action = Send | Sleep | RunTool
Plan = Generator[Action, Any, T]


@dataclass(frozen=True)
class Call:
    """One API operation, as the core sends it (and sends again)."""

    method: str
    path: str
    #: the conversation it concerns: routes the request, learns from the answer
    conversation_id: str | None = None
    body: Any = None
    params: Mapping[str, int] | None = None
    idempotency_key: str | None = None
    deadline_s: float | None = None
    #: ask /route first when the table does not know the conversation (not for a create, whose
    #: answer names the leader, nor for /route itself)
    resolve_route: bool = True
    #: fewer tries than the config allows (the route lookup before a request tries once)
    attempts_max: int | None = None


class Core:
    def __init__(
        self,
        regions: Mapping[str, RegionUrls],
        api_key: str,
        *,
        config: ClientConfig,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng
        self.routing = RoutingTable(
            regions,
            routes_max=config.routes_max,
            region_unreachable_s=config.region_unreachable_s,
        )
        self._auth = f"Bearer {api_key}"

    def new_id(self, prefix: str) -> str:
        """A random id (an Idempotency-Key, a conversation id): 96 bits from the injected rng."""
        return f"{prefix}{self.rng.getrandbits(96):024x}"

    def exchange(self, call: Call) -> Plan[httpx.Response]:
        """Send ``call`` until it succeeds, fails for good, or its budget (``attempts_max``
        requests) or deadline runs out; return the successful response, raise the last error."""
        budget_s = self.config.deadline_s if call.deadline_s is None else call.deadline_s
        deadline_s = self.clock.monotonic() + budget_s
        cid = call.conversation_id
        if cid is not None and call.resolve_route and self.config.resolve_routes:
            if self.routing.routed(cid) is None:
                yield from self._look_up_route(cid, deadline_s)
        attempts_max = call.attempts_max or self.config.attempts_max
        error: ConvplaneError | None = None
        attempts = 0
        while attempts < attempts_max:
            now_s = self.clock.monotonic()
            if now_s >= deadline_s:
                break
            region = self.routing.region_for(cid, now_s)
            attempts += 1
            outcome = yield Send(self._request(call, region, deadline_s - now_s), region)
            now_s = self.clock.monotonic()
            if isinstance(outcome, httpx.Response):
                self.routing.answered(region)
                self.routing.learn(cid, outcome.headers.get(SERVED_BY_HEADER))
                if outcome.is_success:
                    return outcome
            error, delay_s = self._failure(outcome, region, cid, attempts, now_s)
            if not error.retryable or attempts >= attempts_max:
                break
            if now_s + delay_s >= deadline_s:
                break  # the wait would pass the deadline: give up now, with the last error
            if delay_s > 0:
                yield Sleep(delay_s)
        raise self._give_up(error, call, attempts, budget_s)

    def _failure(
        self, outcome: object, region: str, cid: str | None, attempts: int, now_s: float
    ) -> tuple[ConvplaneError, float]:
        """The error a failed try ends in, and how long to wait before the next."""
        if isinstance(outcome, httpx.Response):
            error = error_from_response(outcome)
            if isinstance(error, NotLeader):
                self.routing.learn(cid, error.leader_region)
            return error, self._backoff_s(attempts, error.retry_after_s)
        if not isinstance(outcome, httpx.TransportError):
            raise TypeError(f"a Send is answered with a response or an error, not {outcome!r}")
        # nothing answered: retryable, because every call the client makes is safe to repeat
        failed = TransportFailed(
            f"{region}: {type(outcome).__name__} {outcome}".strip(), retryable=True
        )
        failed.__cause__ = outcome
        self.routing.unreachable(region, cid, now_s)
        # another region can take it at once; only when none answers, wait before the next try
        if self.routing.any_reachable(now_s):
            return failed, 0.0
        return failed, self._backoff_s(attempts, None)

    def _look_up_route(self, conversation_id: str, deadline_s: float) -> Plan[None]:
        """One try at ``GET .../route`` (teaches the table the serving region). Its failure is
        not the call's: the call's own request goes to any region, which forwards it."""
        lookup = Call(
            "GET",
            f"/v1/conversations/{conversation_id}/route",
            conversation_id=conversation_id,
            deadline_s=max(0.0, deadline_s - self.clock.monotonic()),
            resolve_route=False,
            attempts_max=1,
        )
        try:
            response = yield from self.exchange(lookup)
        except ConvplaneError:
            return
        region = _json_field(response, "region")
        self.routing.learn(conversation_id, region if isinstance(region, str) else None)

    def _request(self, call: Call, region: str, remaining_s: float) -> httpx.Request:
        timeout_s = min(self.config.request_timeout_s, remaining_s)
        headers = {
            "Authorization": self._auth,
            DEADLINE_HEADER: str(max(1, int(timeout_s * 1000))),
        }
        if call.idempotency_key is not None:
            headers[IDEMPOTENCY_KEY_HEADER] = call.idempotency_key
        return httpx.Request(
            call.method,
            self.routing.urls[region] + call.path,
            params=dict(call.params) if call.params else None,
            headers=headers,
            json=call.body,
            extensions={"timeout": httpx.Timeout(timeout_s).as_dict()},
        )

    def _backoff_s(self, retries: int, retry_after_s: float | None) -> float:
        """Exponential backoff with equal jitter from the injected rng; never less than the
        plane's ``Retry-After``."""
        ceiling_s = min(
            self.config.backoff_max_s, self.config.backoff_base_s * 2.0 ** (retries - 1)
        )
        jittered_s = ceiling_s / 2 + self.rng.uniform(0, ceiling_s / 2)
        return max(jittered_s, retry_after_s or 0.0)

    @staticmethod
    def _give_up(
        error: ConvplaneError | None, call: Call, attempts: int, budget_s: float
    ) -> ConvplaneError:
        if error is None:
            error = DeadlineExceeded(
                f"the call's deadline ({budget_s:g} s) passed before a request could be sent",
                retryable=True,
            )
        error.idempotency_key = call.idempotency_key
        error.attempts = attempts
        return error


def _json_field(response: httpx.Response, name: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None

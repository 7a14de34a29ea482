"""Forwarding a request to the region that leads its shard.

One hop only: a request carrying ``X-Convplane-Forwarded`` is never forwarded again (the peer
answers 503 instead), so a stale leader hint cannot make requests circle. The caller's remaining
deadline travels in ``X-Convplane-Deadline-Ms`` and bounds the whole forward. A peer that could
not be reached at all (connection refused, or none made within ``forward_connect_timeout_s``:
a host whose packets are dropped never refuses) is retried under a small budget with jittered
backoff, at the node of its region that ``peer_url`` names now (a sibling that answers, once
the refusing node is marked silent); any other failure of a write after it was sent means its outcome is unknown. One
exception: an append the leader answers again with the first one's result (an ``Idempotency-Key``,
or a tool event) whose connection broke after it was sent (not a timeout, not a peer that stopped
answering probes) is sent again under the same budget (an answer that does not settle the
outcome, ``forward_batch.settles_outcome``, is ``outcome_unknown``).

Every forward goes to the leader's peer listener and carries ``X-Convplane-Peer-Auth`` (the
cluster's ``peer_secret``) and ``X-Convplane-Source-Region`` (this node's region): only a
request that listener's gate authenticated (``services.bootstrap.listener_gates``) has its
``X-Convplane-Forwarded`` trusted (``services.api.admission``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from fastapi import Request, Response

from eventlog.aio import abandon
from eventlog.backoff import Backoff
from eventlog.clock import Clock
from eventlog.errors import DeadlineExceeded
from eventlog.http_headers import (
    DEADLINE_HEADER,
    FORWARDED_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENT_REPLAYED_HEADER,
    PEER_AUTH_HEADER,
    SERVED_BY_HEADER,
    SOURCE_REGION_HEADER,
    TENANT_HEADER,
)
from services.api.errors import ForwardFailed
from services.api.forward_batch import (
    AppendBatcher,
    BatchConfig,
    outcome_unknown,
    settles_outcome,
)
from services.api.forward_exchange import (
    CONNECT_TIMEOUT_S,
    BatchExchange,
    HttpxBatchExchange,
)
from services.api.metrics import Metrics
from services.control.region_nodes import PeerUrlOf
from services.peer_protocol import PEER_PROTOCOL_HEADERS

__all__ = ["DEADLINE_HEADER", "FORWARDED_HEADER", "PEER_AUTH_HEADER", "Forwarder"]
_REQUEST_HEADERS = (
    "authorization",
    "content-type",
    IDEMPOTENCY_KEY_HEADER.lower(),
    "accept",
    TENANT_HEADER.lower(),  # service-key reads on behalf of a tenant (replay workers)
)
_RESPONSE_HEADERS = (
    "content-type",
    "retry-after",
    IDEMPOTENT_REPLAYED_HEADER.lower(),
    SERVED_BY_HEADER.lower(),
)


T = TypeVar("T")


class _PeerLost(Exception):
    """The target region stopped answering probes while a forward to it was in flight."""


#: how often an in-flight forward checks that its target still answers probes
_REACHABILITY_CHECK_S = 0.1


class Forwarder:
    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        peer_url: PeerUrlOf,
        clock: Clock,
        rng: random.Random,
        metrics: Metrics,
        retries_max: int,
        backoff_s: float,
        source_region: str,
        peer_secret: str | None = None,
        peer_reachable: Callable[[str], bool] | None = None,
        refused: Callable[[str, str], None] = lambda region, url: None,
        node_lost: Callable[[str, str], bool] = lambda region, url: False,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        inject_trace: Callable[[dict[str, str]], None] | None = None,
        batch_limits: BatchConfig | None = None,
        batch_exchange: BatchExchange | None = None,
    ) -> None:
        self._client = client
        #: adds the trace context to a forward's headers (services.tracing; None: tracing off)
        self._inject_trace = inject_trace
        #: appends go to their leader in batches (``services.api.forward_batch``) when given
        self._batcher = (
            AppendBatcher(
                exchange=batch_exchange
                or HttpxBatchExchange(client, connect_timeout_s=connect_timeout_s),
                clock=clock,
                rng=rng,
                limits=batch_limits,
                peer_secret=peer_secret,
                source_region=source_region,
                while_reachable=self._while_reachable,
                refused=refused,
                peer_url=peer_url,
                count=lambda region, outcome: metrics.forwarded.labels(region, outcome).inc(),
            )
            if batch_limits is not None
            else None
        )
        #: False for a region this node's own probes say is unreachable: forwarding there
        #: fails fast (503, retryable) instead of waiting out the caller's deadline on a
        #: black-holed link, so the client retries through another region at once
        self._peer_reachable = peer_reachable
        self._peer_secret = peer_secret
        self._source_region = source_region
        self._peer_url = peer_url  # read live: the node leading a shard may change
        #: (region, peer URL): that node refused a connection (``RegionNodes.refused``), so
        #: the retry, and later forwards, may go to another of the region's nodes
        self._refused = refused
        #: (region, peer URL): that node has been silent for the detection time
        #: (``RegionNodes.lost``): a forward in flight to it is given up as to a lost region
        self._node_lost = node_lost
        #: a connection not made within it sent nothing: passed over as a refusal is
        self._connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._rng = rng
        self._metrics = metrics
        self._retries_max = retries_max
        self._backoff_s = backoff_s

    async def forward(
        self,
        request: Request,
        *,
        target_region: str,
        shard: int | None = None,
        deadline_s: float,
        is_write: bool,
        body: bytes | None = None,
        batchable: bool = False,
        repeatable: bool = False,
    ) -> Response:
        """Send ``request`` (or it with ``body`` instead of its own) to ``target_region``'s node
        that leads ``shard`` (None: the control shard's node);
        ``batchable``: an append, which may travel in a batch with others; ``repeatable``: an
        append the leader answers again with the first one's result (an Idempotency-Key or a
        tool event, ``eventlog.conversation_state.repeat_gets_first_result``), which may be
        sent again after a lost attempt."""
        base_url = self._peer_url(target_region, shard)
        if base_url is None:
            raise ForwardFailed(f"leader region {target_region!r} is not in the cluster file")
        if self._peer_reachable is not None and not self._peer_reachable(target_region):
            self._metrics.forwarded.labels(target_region, "suspected").inc()
            raise ForwardFailed(f"leader region {target_region} is not answering probes")
        if self._node_lost(target_region, base_url):  # no sibling of it answers either
            self._metrics.forwarded.labels(target_region, "suspected").inc()
            raise ForwardFailed(f"the node of {target_region} leading the shard is not answering")
        if batchable and body is None and self._batcher is not None:
            raw = await request.body()
            if self._batcher.fits(raw):
                sent_s = self._clock.monotonic()
                answer = await self._batcher.forward(
                    target_region=target_region,
                    base_url=base_url.rstrip("/"),
                    conversation_id=request.path_params["conversation_id"],
                    body=raw,
                    authorization=request.headers.get("authorization", ""),
                    idempotency_key=request.headers.get(IDEMPOTENCY_KEY_HEADER),
                    repeatable=repeatable,
                    deadline_s=deadline_s,
                    shard=shard,
                )
                self._metrics.observe_forward(target_region, self._clock.monotonic() - sent_s)
                return answer
        url = base_url.rstrip("/") + escaped_path(request.url.path)
        if body is None:
            body = await request.body()
            headers = self._headers(request)
        else:
            headers = {**self._headers(request), "content-type": "application/json"}
        if self._peer_secret is not None:
            headers[PEER_AUTH_HEADER] = self._peer_secret
        headers[SOURCE_REGION_HEADER] = self._source_region
        headers.update(PEER_PROTOCOL_HEADERS)
        if self._inject_trace is not None:
            self._inject_trace(headers)
        started_s = self._clock.monotonic()
        backoff = Backoff(self._backoff_s, self._backoff_s * 2**self._retries_max, self._rng)
        lost_once = False  # an attempt was sent and lost: it may have been applied
        for attempt in range(self._retries_max + 1):
            remaining_s = deadline_s - self._clock.monotonic()
            if remaining_s <= 0:
                break
            try:
                reply = await self._while_reachable(
                    target_region,
                    base_url,
                    self._client.request(
                        request.method,
                        url,
                        params=request.url.query or None,
                        content=body or None,
                        headers={**headers, DEADLINE_HEADER: str(max(1, int(remaining_s * 1000)))},
                        timeout=httpx.Timeout(
                            remaining_s, connect=min(self._connect_timeout_s, remaining_s)
                        ),
                    ),
                )
            except _PeerLost as exc:
                self._metrics.forwarded.labels(target_region, "peer_lost").inc()
                if is_write:
                    raise outcome_unknown(target_region) from exc
                raise ForwardFailed(f"leader region {target_region} stopped answering") from exc
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
                self._metrics.forwarded.labels(target_region, "connect_error").inc()
                self._refused(target_region, base_url)
                if attempt == self._retries_max:
                    if lost_once:
                        raise outcome_unknown(target_region) from exc
                    raise ForwardFailed(f"leader region {target_region} unreachable") from exc
                await self._clock.sleep(min(backoff.next_s(), remaining_s))
                base_url = self._peer_url(target_region, shard) or base_url
                url = base_url.rstrip("/") + escaped_path(request.url.path)
                continue
            except httpx.TimeoutException as exc:
                self._metrics.forwarded.labels(target_region, "timeout").inc()
                raise _deadline_error(is_write, target_region) from exc
            except httpx.HTTPError as exc:
                self._metrics.forwarded.labels(target_region, "error").inc()
                if repeatable and attempt < self._retries_max:  # at once (httpx never reuses
                    lost_once = True  # a connection that failed)
                    self._metrics.forwarded.labels(target_region, "resent").inc()
                    continue
                if is_write:
                    raise outcome_unknown(target_region) from exc
                raise ForwardFailed(f"forward to {target_region} failed: {exc!r}"[:300]) from exc
            self._metrics.forwarded.labels(target_region, "ok").inc()
            self._metrics.observe_forward(target_region, self._clock.monotonic() - started_s)
            if lost_once and not settles_outcome(reply.status_code):
                raise outcome_unknown(target_region)
            return _relayed(reply)
        raise _deadline_error(is_write, target_region)

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()

    async def _while_reachable(
        self, target_region: str, url: str, call: Coroutine[Any, Any, T]
    ) -> T:
        """Await ``call`` unless the target stops answering probes first (its region, or
        the node at ``url`` for the detection time): a forward on a black-holed link
        (partition, a node's dead host) then fails in about the detection time instead of the
        caller's whole deadline, and the client retries through a node that can help."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_REACHABILITY_CHECK_S)
                if done:
                    return task.result()
                if (
                    self._peer_reachable is not None and not self._peer_reachable(target_region)
                ) or self._node_lost(target_region, url):
                    abandon(task)
                    raise _PeerLost(target_region)
        except asyncio.CancelledError:
            abandon(task)
            raise

    @staticmethod
    def _headers(request: Request) -> dict[str, str]:
        headers = {k: v for k in _REQUEST_HEADERS if (v := request.headers.get(k)) is not None}
        headers[FORWARDED_HEADER] = "1"
        return headers


def escaped_path(path: str) -> str:
    """``path`` (decoded, as routed here) with every segment percent-encoded again, so the
    leader routes exactly the segments this node did (an id holding ``/``, ``%`` or ``?``
    stays one segment)."""
    return "/".join(quote(segment, safe="") for segment in path.split("/"))


def _relayed(reply: httpx.Response) -> Response:
    headers = {k: v for k in _RESPONSE_HEADERS if (v := reply.headers.get(k)) is not None}
    content_type = headers.pop("content-type", None)
    return Response(
        reply.content, status_code=reply.status_code, headers=headers, media_type=content_type
    )


def _deadline_error(is_write: bool, target_region: str) -> Exception:
    if is_write:
        return outcome_unknown(target_region)
    return DeadlineExceeded(f"deadline passed while forwarding to {target_region}")

"""Forwarded appends travel to their leader region in batches.

An entry node that forwards appends to a leader region sends them as one peer call, ``POST
/peer/forwarded-appends``. The leader serves each item exactly as if it had arrived alone as a
forward (the same admission, body checks, validation, auth, idempotency, deadline from
``X-Convplane-Deadline-Ms``): by the fast lane (``services.api.fast_lane``, given to the route as
``forward_batch_router(lane)``), which runs the app's steps without its layers, or, where the lane
does not take an item (a malformed one, or tracing on), through its whole app; all items
concurrently, and streams each item's answer back (one NDJSON line per item, in the order they
finish), so an item is never held back by a slower one in its batch. A batch therefore changes what
a forward costs (one HTTP exchange, one TLS write and one pooled-connection checkout per batch
instead of per append) and nothing a client sees.

Batches form by themselves, as group commit does: per peer region at most
``forward_batches_in_flight_max`` batches (default 1) are under way; appends that arrive
meanwhile queue (at most ``forward_queue_max``: beyond it 503 ``overloaded``) and leave in the
next batch, up to ``forward_batch_max`` items and ``FORWARD_BATCH_BYTES_MAX`` bytes. There is no
linger: an append to an idle peer leaves at once, in a batch of one. Few large batches cost the
leader less too: its items arrive together and share group commits (``bench/rest.py``: 1 in
flight did 1.5 x the any-region throughput of 4, at lower latency). A batch still unanswered
after ``forward_batch_straggler_s`` stops holding the next one back (an item waiting on a slow
shard must not stall every append to its region), and at most ``forward_batches_open_max``
batches are open per peer, stragglers included.

Outcomes are the single forward's (``services.api.forwarding``): an item's deadline bounds its
wait; a batch that could not be sent (no connection: refused, failed, or not made within the
connect timeout) is retried under the same budget, at the node the forwarder's ``peer_url``
names for its first item's shard now (a sibling, once the refusing node is marked silent); an
item whose deadline passed while nothing of it had left (still
queued, its batch still connecting, or only attempts that made no connection) is 504
``deadline_exceeded``: it was not applied, and it is withdrawn from its batch (a batch's body is
built once its connection is ready, ``forward_exchange.BodyBuilder``); the batch's own refusal
(the leader's peer admission, its 401) is every item's answer (``outcome_unknown`` for an item a
lost attempt carried, below).

A batch lost after it left (its connection broke, its answer came back cut short or malformed)
while the leader still answers probes is not the leader's failure, and an item it carried may or
may not have been applied. An item the leader answers again with the first one's result (an
``Idempotency-Key``, or a tool event: its ``attempt_id`` identifies it for the conversation's
life; ``eventlog.conversation_state.repeat_gets_first_result``) is sent again, in the same
batch's next attempt on a new connection, under the same retry bound and its own deadline: the
leader answers the repeat with the first one's result (200 and ``Idempotent-Replayed``, where the
first answer would have been 201), or applies it if the first never landed. Its answer then stands
only when it settles the outcome (``settles_outcome``: a success, or a refusal of the request's
own bytes); any other (a 404 or 409 may come while the first attempt is still under way, a 5xx,
408 or 429 refused the repeat for the moment) is ``outcome_unknown``. Any other item (a message
or note without a key) is ``outcome_unknown`` (sending it again could apply it twice), and so is
an item whose answer did not arrive by its deadline, one whose leader stopped answering probes,
and a repeatable one whose later attempts failed too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from eventlog.backoff import Backoff
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError, DeadlineExceeded, Overloaded, Unauthorized
from eventlog.http_headers import (
    DEADLINE_HEADER,
    FORWARDED_HEADER,
    IDEMPOTENCY_KEY_HEADER_RAW,
    IDEMPOTENT_REPLAYED_HEADER,
    PEER_AUTH_HEADER,
    SERVED_BY_HEADER,
)
from services.api.errors import ForwardFailed, OutcomeUnknown
from services.api.event_bodies import integral
from services.api.forward_exchange import NDJSON, BatchExchange, BatchLost, BatchNotSent
from services.api.peer_trust import PEER_REGION_SCOPE_KEY, SOURCE_REGION_HEADER, peer_region
from services.api.schemas import ConversationId
from services.peer_protocol import PEER_PROTOCOL_HEADERS

#: the largest batch body a leader takes (route limit); an append bigger than half of it is
#: forwarded on its own
FORWARD_BATCH_BYTES_MAX = 1024 * 1024
#: a batch's whole body, at most: its items and their JSON envelope (the edge's limit on it)
BATCH_BODY_BYTES_MAX = FORWARD_BATCH_BYTES_MAX + 64 * 1024
#: items in one batch, at most (the leader refuses more with 400)
FORWARD_BATCH_ITEMS_MAX = 256
#: the longest deadline an item may carry (a node's own max_deadline_ms is far below)
DEADLINE_MS_MAX = 3_600_000
BATCH_PATH = "/peer/forwarded-appends"
_RELAYED_HEADERS = ("retry-after", IDEMPOTENT_REPLAYED_HEADER.lower(), SERVED_BY_HEADER.lower())

log = logging.getLogger("convplane.forward_batch")


# --- the wire ------------------------------------------------------------------------------------


class ForwardedAppend(BaseModel):
    """One append as its entry node received it (after its own checks)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    conversation_id: ConversationId
    authorization: Annotated[str, StringConstraints(max_length=512)]
    idempotency_key: Annotated[str, StringConstraints(max_length=255)] | None = None
    deadline_ms: Annotated[int, Field(ge=1, le=DEADLINE_MS_MAX), BeforeValidator(integral)] = Field(
        description="what is left of its deadline"
    )
    body: Annotated[str, StringConstraints(max_length=FORWARD_BATCH_BYTES_MAX)] = Field(
        description="the append's JSON body, as received"
    )


class ForwardedAppends(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    items: list[ForwardedAppend] = Field(min_length=1, max_length=FORWARD_BATCH_ITEMS_MAX)


def _answer_line(index: int, status: int, headers: dict[str, str], body: bytes) -> bytes:
    text = body.decode(errors="replace")  # the app answers JSON in UTF-8
    line = {"index": index, "status": status, "headers": headers, "body": text}
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


# --- the leader's side -----------------------------------------------------------------------


class LaneAnswer(Protocol):
    """An item's answer from the lane (``services.api.fast_lane.LaneResponse``)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class ItemLane(Protocol):
    """What serves a batch's items without the app's layers: the node's fast lane
    (``services.api.fast_lane.FastLane.serve_forwarded``); None: the app serves the item."""

    async def serve_forwarded(
        self,
        scope: MutableMapping[str, Any],
        conversation_id: str,
        authorization: str,
        idempotency_keys: list[bytes],
        body: bytes,
    ) -> LaneAnswer | None: ...


def forward_batch_router(lane: ItemLane | None) -> APIRouter:
    """The leader's route for forward batches; ``lane`` serves the items it takes (None: the
    app serves every item)."""
    router = APIRouter(prefix="/peer")

    @router.post(
        "/forwarded-appends",
        response_class=StreamingResponse,
        max_body_size=FORWARD_BATCH_BYTES_MAX,
        responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}}}},
    )
    async def forwarded_appends(request: Request, batch: ForwardedAppends) -> StreamingResponse:
        """Internal: appends forwarded by an entry node in one call; each runs as if forwarded
        alone and its answer is one NDJSON line `{index, status, headers, body}`, in the order
        the items finish. Only from a peer the peer listener authenticated
        (``services.bootstrap.listener_gates``): each item is then a trusted forward from that peer's
        region."""
        if peer_region(request.scope) is None:
            raise Unauthorized("forward batches come from the cluster's nodes only")
        return StreamingResponse(_run_items(request, batch, lane), media_type=NDJSON)

    return router


async def _run_items(
    request: Request, batch: ForwardedAppends, lane: ItemLane | None
) -> AsyncIterator[bytes]:
    answers: asyncio.Queue[bytes] = asyncio.Queue(maxsize=len(batch.items))
    tasks = [
        asyncio.create_task(_run_item(request, lane, i, item, answers))
        for i, item in enumerate(batch.items)
    ]
    try:
        unanswered = len(tasks)
        while unanswered:
            lines = [await answers.get()]
            while not answers.empty():  # answered in the same group commit: one chunk
                lines.append(answers.get_nowait())
            unanswered -= len(lines)
            yield b"".join(lines)
    finally:
        for task in tasks:  # the entry node went away: like a client that hung up
            task.cancel()


async def _run_item(
    request: Request,
    lane: ItemLane | None,
    index: int,
    item: ForwardedAppend,
    answers: asyncio.Queue[bytes],
) -> None:
    # a body that is no JSON text (lone surrogates included) gets the app's own 400
    body = item.body.encode(errors="surrogatepass")
    authorization = item.authorization.encode("latin-1", "replace")
    idempotency_key = (
        None if item.idempotency_key is None else item.idempotency_key.encode("latin-1", "replace")
    )
    headers = [
        (b"authorization", authorization),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (FORWARDED_HEADER.lower().encode(), b"1"),
        (DEADLINE_HEADER.lower().encode(), str(item.deadline_ms).encode()),
    ]
    if idempotency_key is not None:
        headers.append((IDEMPOTENCY_KEY_HEADER_RAW, idempotency_key))
    path = f"/v1/conversations/{item.conversation_id}/events"
    scope = {
        **{k: v for k, v in request.scope.items() if k in ("asgi", "client", "server", "state")},
        "type": "http",
        "http_version": "1.1",
        "scheme": request.scope.get("scheme", "http"),
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        PEER_REGION_SCOPE_KEY: request.scope[PEER_REGION_SCOPE_KEY],  # a trusted forward
    }
    if lane is not None:
        served = await lane.serve_forwarded(
            scope,
            item.conversation_id,
            authorization.decode("latin-1"),  # as the app reads the header
            [idempotency_key] if idempotency_key is not None else [],
            body,
        )
        if served is not None:
            relayed = {
                name: value.decode("latin-1")
                for key, value in served.headers
                if (name := key.decode("latin-1")) in _RELAYED_HEADERS
            }
            await answers.put(_answer_line(index, served.status, relayed, served.body))
            return
    status, answer_headers, chunks = 500, {}, []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await asyncio.Event().wait()  # no disconnect to report: the item runs to its end
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            for key, value in message.get("headers", ()):
                name = bytes(key).decode("latin-1").lower()
                if name in _RELAYED_HEADERS:
                    answer_headers[name] = bytes(value).decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    try:
        await request.app(scope, receive, send)
    except Exception:  # a bug: the app's error middleware already answered it 500
        log.exception("forwarded append %d failed", index)
    await answers.put(_answer_line(index, status, answer_headers, b"".join(chunks)))


# --- the entry node's side ---------------------------------------------------------------------


@dataclass
class _Item:
    encoded: bytes  # the item's JSON, deadline_ms filled in when its batch leaves
    deadline_s: float
    answer: asyncio.Future[Response]
    #: the leader answers a repeat with the first one's result (it carries an Idempotency-Key,
    #: or it is a tool event: ``Forwarder.forward``)
    repeatable: bool = False
    #: an attempt to send its batch is under way or may have reached the leader; False while
    #: it waits in the queue and after attempts that left nothing (``BatchNotSent``)
    may_have_left: bool = False
    #: an earlier attempt carried it and was lost (``BatchLost``): it may have been applied,
    #: whatever later attempts do
    lost_once: bool = False
    #: the shard it appends to (None: unknown): where an attempt that sent nothing goes next
    shard: int | None = None

    def may_be_applied(self) -> bool:
        return self.may_have_left or self.lost_once


@dataclass
class _Lane:
    """One peer region: what waits to leave, and how many batches are under way."""

    queue: deque[_Item] = field(default_factory=deque)
    busy: int = 0  # batches the next one waits for (not stragglers)
    open: int = 0  # batches not yet fully answered, stragglers included


@dataclass(frozen=True)
class BatchConfig:
    batch_max: int
    batches_in_flight_max: int
    straggler_s: float
    batches_open_max: int
    queue_max: int
    retries_max: int
    backoff_s: float


class AppendBatcher:
    """Sends forwarded appends to each peer region in batches (module docstring)."""

    def __init__(
        self,
        *,
        exchange: BatchExchange,
        clock: Clock,
        rng: random.Random,
        limits: BatchConfig,
        peer_secret: str | None,
        source_region: str,
        #: (target region, peer URL, the exchange): awaits it unless the target stops
        #: answering probes first (``Forwarder``'s)
        while_reachable: Callable[[str, str, Coroutine[Any, Any, None]], Awaitable[None]],
        count: Callable[[str, str], None],
        refused: Callable[[str, str], None] = lambda region, url: None,
        peer_url: Callable[[str, int | None], str | None] = lambda region, shard: None,
    ) -> None:
        self._sender = exchange
        self._clock = clock
        self._rng = rng
        self._limits = limits
        self._peer_secret = peer_secret
        self._source_region = source_region
        self._while_reachable = while_reachable
        self._count = count  # (target region, outcome): the forward counter
        self._refused = refused  # (target region, peer URL): ``Forwarder``'s
        #: (target region, shard) -> the node to send to now (``Forwarder``'s, read live): after
        #: an attempt that sent nothing, the next goes where it names (a sibling that answers)
        self._peer_url = peer_url
        self._lanes: dict[str, _Lane] = {}
        self._senders: set[asyncio.Task[None]] = set()

    @staticmethod
    def fits(body: bytes) -> bool:
        """Whether ``body`` can travel in a batch: not too big, and UTF-8 (JSON also comes in
        UTF-16 and UTF-32, which a batch, itself JSON text, does not carry as sent)."""
        if len(body) > FORWARD_BATCH_BYTES_MAX // 2:
            return False
        try:
            body.decode()
        except UnicodeDecodeError:
            return False
        return True

    async def forward(
        self,
        *,
        target_region: str,
        base_url: str,
        conversation_id: str,
        body: bytes,
        authorization: str,
        idempotency_key: str | None,
        repeatable: bool,
        deadline_s: float,
        shard: int | None = None,
    ) -> Response:
        lane = self._lanes.setdefault(f"{target_region} {base_url}", _Lane())
        if len(lane.queue) >= self._limits.queue_max:
            self._count(target_region, "queue_full")
            raise Overloaded(f"too many appends waiting to be forwarded to {target_region}")
        fields = {
            "conversation_id": conversation_id,
            "authorization": authorization,
            "idempotency_key": idempotency_key,
            "body": body.decode(),
        }
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(_retrieve)
        item = _Item(
            json.dumps(fields, separators=(",", ":")).encode(),
            deadline_s,
            answer,
            repeatable=repeatable,
            shard=shard,
        )
        lane.queue.append(item)
        self._pump(target_region, base_url, lane)
        remaining_s = deadline_s - self._clock.monotonic()
        try:
            async with asyncio.timeout(max(0.0, remaining_s)):
                return await asyncio.shield(answer)
        except TimeoutError:
            self._count(target_region, "timeout")
            if not item.may_be_applied():
                item.answer.cancel()  # withdrawn: no later attempt of its batch carries it
                raise _not_forwarded_in_time(target_region) from None
            raise outcome_unknown(target_region) from None

    async def close(self) -> None:
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)

    def _pump(self, target_region: str, base_url: str, lane: _Lane) -> None:
        limits = self._limits
        while (
            lane.queue
            and lane.busy < limits.batches_in_flight_max
            and lane.open < limits.batches_open_max
        ):
            items = self._take(lane)
            if not items:
                continue
            lane.busy += 1
            lane.open += 1
            task = asyncio.create_task(self._send(target_region, base_url, lane, items))
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)

    def _take(self, lane: _Lane) -> list[_Item]:
        """The next batch: oldest first, within the item and byte bounds; items whose
        deadline passed or whose caller gave up are dropped (they never left)."""
        items: list[_Item] = []
        size = 0
        now_s = self._clock.monotonic()
        while lane.queue and len(items) < self._limits.batch_max:
            item = lane.queue[0]
            if item.answer.done() or item.deadline_s <= now_s:
                lane.queue.popleft()
                continue
            if items and size + len(item.encoded) + 64 > FORWARD_BATCH_BYTES_MAX:
                break
            items.append(lane.queue.popleft())
            size += len(item.encoded) + 64
        return items

    async def _send(
        self, target_region: str, base_url: str, lane: _Lane, items: list[_Item]
    ) -> None:
        exchange = asyncio.ensure_future(self._exchange(target_region, base_url, items))
        straggling = False
        lost = False  # its target stopped answering probes while it was under way
        try:
            done, _ = await asyncio.wait({exchange}, timeout=self._limits.straggler_s)
            if not done:  # a straggler: the next batch leaves without waiting for it
                straggling = True
                lane.busy -= 1
                self._pump(target_region, base_url, lane)
            await exchange
        except asyncio.CancelledError:
            exchange.cancel()
            raise
        except ConvplaneError as exc:  # the batch's own error is every unanswered item's,
            # but for an item an earlier, lost attempt carried (it may have been applied)
            for item in items:
                if not item.answer.done() and not item.lost_once:
                    item.answer.set_exception(exc)
        except Exception as exc:  # lost after it left (its target stopped answering probes,
            # a broken stream): what was not answered is unknown (below)
            log.warning("forward batch to %s lost: %r", target_region, exc)
            self._count(target_region, "peer_lost")
            lost = True
        finally:
            for item in items:
                if item.answer.done():
                    continue
                if item.may_be_applied():
                    item.answer.set_exception(outcome_unknown(target_region))
                elif lost:  # its batch was still connecting: not applied
                    item.answer.set_exception(_not_sent_to_lost(target_region))
                else:  # left out of every attempt (its deadline passed): not applied
                    item.answer.set_exception(_not_forwarded_in_time(target_region))
            if not straggling:
                lane.busy -= 1
            lane.open -= 1
            self._pump(target_region, base_url, lane)

    async def _exchange(self, target_region: str, base_url: str, items: list[_Item]) -> None:
        limits = self._limits
        backoff = Backoff(limits.backoff_s, limits.backoff_s * 2**limits.retries_max, self._rng)
        headers = {
            "content-type": "application/json",
            SOURCE_REGION_HEADER: self._source_region,
            **PEER_PROTOCOL_HEADERS,
        }
        if self._peer_secret is not None:
            headers[PEER_AUTH_HEADER] = self._peer_secret
        for attempt in range(limits.retries_max + 1):
            live = self._unanswered(items)
            if not live:
                return
            remaining_s = max(item.deadline_s for item in live) - self._clock.monotonic()
            if remaining_s <= 0:  # every item's deadline passed: those that may have left are
                raise _not_forwarded_in_time(target_region)  # answered unknown (``_send``)
            try:
                await self._while_reachable(
                    target_region,
                    base_url,
                    self._post(target_region, base_url + BATCH_PATH, headers, items, remaining_s),
                )
                return
            except BatchNotSent as exc:  # nothing was sent: safe to try again
                for item in items:
                    item.may_have_left = False
                self._count(target_region, "connect_error")
                self._refused(target_region, base_url)
                if attempt == limits.retries_max:
                    raise ForwardFailed(f"leader region {target_region} unreachable") from exc
                await self._clock.sleep(min(backoff.next_s(), remaining_s))
                base_url = (self._peer_url(target_region, live[0].shard) or base_url).rstrip("/")
            except BatchLost as exc:
                self._count(target_region, "error")
                if attempt == limits.retries_max or not self._resendable(target_region, items):
                    raise outcome_unknown(target_region) from exc
                log.info(
                    "forward batch to %s lost (%r): sending its repeatable items again",
                    target_region,
                    exc,
                )
                self._count(target_region, "resent")

    def _resendable(self, target_region: str, items: list[_Item]) -> bool:
        """After a lost attempt: an item it carried may have been applied. One that is not
        ``repeatable`` is ``outcome_unknown`` now (sent again it could be applied twice); a
        repeatable one may go again, at once, on a fresh connection (a lost one is never
        reused): the leader answers it with the first one's result if that was applied, and
        applies it if not. Whether any item is left to send."""
        for item in items:
            if item.may_have_left:
                item.lost_once = True
                if not item.repeatable and not item.answer.done():
                    item.answer.set_exception(outcome_unknown(target_region))
        return bool(self._unanswered(items))

    def _unanswered(self, items: list[_Item]) -> list[_Item]:
        """Items that may still leave: an item answered meanwhile (its caller told "not
        applied") or past its deadline (its caller is about to be told so) never does."""
        now_s = self._clock.monotonic()
        return [item for item in items if not item.answer.done() and item.deadline_s > now_s]

    async def _post(
        self,
        target_region: str,
        url: str,
        headers: dict[str, str],
        items: list[_Item],
        timeout_s: float,
    ) -> None:
        sent: list[_Item] = []  # what the body carries, in its order: an answer's index

        def body() -> bytes | None:
            """Built once the connection is ready, so the handshake's time counts: an item
            whose deadline passed meanwhile stays out (and is answered 504, not applied)."""
            sent[:] = self._unanswered(items)
            if not sent:
                return None
            now_s = self._clock.monotonic()
            for item in sent:
                item.may_have_left = True
            return (
                b'{"items":['
                + b",".join(
                    _with_deadline(item, max(1, int((item.deadline_s - now_s) * 1000)))
                    for item in sent
                )
                + b"]}"
            )

        def answered(line: bytes) -> None:
            try:
                index, response = _parsed_line(line, len(sent))
            except (ValueError, LookupError, TypeError) as exc:
                raise BatchLost(f"{target_region}: a malformed answer line: {exc!r}") from exc
            self._count(target_region, "ok")
            _settle(sent[index], response, target_region, settles_outcome(response.status_code))

        refused = await self._sender.send(target_region, url, body, headers, timeout_s, answered)
        if refused is not None:  # the batch's own answer is every item's (the leader did not
            # look at the items: it says nothing of an earlier, lost attempt's)
            response = _response(refused.status, refused.headers, refused.body)
            for item in sent:
                _settle(item, response, target_region, settles=False)


def _settle(item: _Item, response: Response, target_region: str, settles: bool) -> None:
    """``response`` is ``item``'s answer, unless an earlier, lost attempt carried it and this
    answer does not ``settle`` whether that one was applied."""
    if item.answer.done():
        return
    if item.lost_once and not settles:
        item.answer.set_exception(outcome_unknown(target_region))
    else:
        item.answer.set_result(response)


def settles_outcome(status: int) -> bool:
    """Whether the leader's answer to an append sent again after a lost attempt settles what
    became of the lost one: a success (the repeat's result, or the first one's if it landed), or
    a refusal of the request's own bytes (400: its body, or a full conversation, which stays
    full; 413; 415), which the first met too. Any other may come while the first is still under
    way at the leader and applies after it (a 404 before its conversation's creation commits, a
    409 on a seq or a tool attempt still in flight, a 401 or 403 on a key revoked since), or
    refused the repeat for the moment (408, 429, 5xx)."""
    return 200 <= status < 300 or status in (400, 413, 415)


def _parsed_line(line: bytes, items: int) -> tuple[int, Response]:
    """An answer line's item index and answer; ValueError, LookupError or TypeError if it is
    not one the leader writes (``_answer_line``)."""
    answer = json.loads(line)
    index, status, headers, body = (
        answer["index"],
        answer["status"],
        answer["headers"],
        answer["body"],
    )
    if type(index) is not int or not 0 <= index < items:
        raise ValueError(f"index {index!r} of {items} items")
    if type(status) is not int or not 100 <= status <= 599:
        raise ValueError(f"status {status!r}")
    if not isinstance(headers, dict) or not isinstance(body, str):
        raise TypeError("headers or body of the wrong type")
    return index, _response(status, headers, body.encode())


def _with_deadline(item: _Item, deadline_ms: int) -> bytes:
    return item.encoded[:-1] + b',"deadline_ms":' + str(deadline_ms).encode() + b"}"


def _response(status: int, headers: Any, body: bytes) -> Response:
    relayed = {k: v for k in _RELAYED_HEADERS if (v := headers.get(k)) is not None}
    return Response(body, status_code=status, headers=relayed, media_type="application/json")


def outcome_unknown(target_region: str) -> OutcomeUnknown:
    """The answer to a forwarded write that may or may not have been applied."""
    return OutcomeUnknown(
        f"the append was forwarded to {target_region} and its outcome is unknown; retrying with "
        "the same Idempotency-Key is safe"
    )


def _not_forwarded_in_time(target_region: str) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"the deadline passed before the append could be forwarded to {target_region}; it was "
        "not applied"
    )


def _not_sent_to_lost(target_region: str) -> ForwardFailed:
    return ForwardFailed(
        f"the node of {target_region} this append was to go to stopped answering before a "
        "connection to it was made; it was not applied"
    )


def _retrieve(answer: asyncio.Future[Response]) -> None:
    """An answer nobody waits for any more (its caller's deadline passed) is dropped quietly."""
    if not answer.cancelled():
        answer.exception()

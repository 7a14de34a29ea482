"""The fast lane (``services.api.fast_lane``) answers exactly what the app answers.

Two identical two-region planes (fake logs, virtual time) get the same requests on the wire,
through the real client-listener protocol: on one, each request arrives in one write, so the
lane may take it; on the other, the head and the body arrive in two writes, which the lane never
takes, so the app serves every request there. Status, headers (names, order, values) and bodies
must be the same, request by request, and so must the request metrics. Requests the lane takes
and requests it hands back to the app are both in the script: fresh appends, idempotent retries,
every conflict, a forward to the other region, the refusals of admission, and every malformed
request. The same for the items of forward batches at their leader, with its lane open and
closed, also while its admission sheds them (queue full, queued past the deadline). Reads of a
conversation (they have no body to split) are compared between a connection with the lane and
one without it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from eventlog.http_headers import PEER_AUTH_HEADER
from services.api import fast_lane
from services.api.append_outcomes import AppendOutcomes
from services.api.forward_batch import BATCH_PATH
from services.bootstrap.app import NodeApp
from tests.unit.admission_nodes import (
    SECRET,
    SlowLog,
    build_node,
    cluster,
    metric_value,
    node_clock,
    until,
    until_metric,
)
from tests.unit.api_fakes import KEY_A, KEY_B, HostRouting, conversation_led_by, peer_listener
from tests.unit.clocks import ManualClock
from tests.unit.wire_client import WireConnection, WireResponse, raw_request

AUTH_A = {"authorization": f"Bearer {KEY_A}", "content-type": "application/json"}
AUTH_B = {"authorization": f"Bearer {KEY_B}", "content-type": "application/json"}
EAST_CONV = conversation_led_by("east")
WEST_CONV = conversation_led_by("west")


@dataclass
class Plane:
    east: NodeApp
    west: NodeApp
    west_log: SlowLog
    clock: ManualClock


@asynccontextmanager
async def plane(**limits: Any) -> AsyncIterator[Plane]:
    clock = node_clock()
    routing = HostRouting()
    config = cluster(SECRET)
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=routing))
        apps, logs = {}, {}
        for region in ("east", "west"):
            logs[region] = SlowLog(region, clock)
            app = build_node(region, logs[region], peers, clock, config, **limits)
            routing.apps[f"{region}.test"] = peer_listener(app, config)
            await stack.enter_async_context(app.router.lifespan_context(app))
            apps[region] = app
        yield Plane(apps["east"], apps["west"], logs["west"], clock)


def append(
    conversation_id: str,
    event: Any,
    headers: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> bytes:
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    return raw_request(
        f"/v1/conversations/{conversation_id}/events",
        body,
        {**(headers or AUTH_A), **(extra or {})},
    )


def create(conversation_id: str) -> bytes:
    body = json.dumps({"conversation_id": conversation_id}).encode()
    return raw_request("/v1/conversations", body, AUTH_A)


USER = {"type": "message.user", "payload": {"content": "hello"}}
OTHER = {"type": "message.user", "payload": {"content": "something else"}}
ATTEMPT = {
    "type": "tool.attempt",
    "payload": {"attempt_id": "a1", "tool": "search", "argument_digest": "d1"},
}
EFFECT_OK = {"type": "tool.effect", "payload": {"attempt_id": "a1", "status": "committed"}}
EFFECT_FAILED = {"type": "tool.effect", "payload": {"attempt_id": "a1", "status": "failed"}}

#: (what the request is, the request): in order, on one connection
SCRIPT: list[tuple[str, bytes]] = [
    ("create", create(EAST_CONV)),
    ("create led elsewhere", create(WEST_CONV)),
    ("fresh append", append(EAST_CONV, USER, extra={"idempotency-key": "k1"})),
    ("idempotent retry", append(EAST_CONV, USER, extra={"idempotency-key": "k1"})),
    ("key reused", append(EAST_CONV, OTHER, extra={"idempotency-key": "k1"})),
    ("seq conflict", append(EAST_CONV, {**USER, "expected_seq": 7})),
    ("expected seq", append(EAST_CONV, {**USER, "expected_seq": 1})),
    ("tool attempt", append(EAST_CONV, ATTEMPT)),
    ("tool effect", append(EAST_CONV, EFFECT_OK)),
    ("effect conflict", append(EAST_CONV, EFFECT_FAILED)),
    ("unknown conversation", append("nobody-here", USER)),
    ("forwarded to its leader", append(WEST_CONV, USER, extra={"idempotency-key": "k2"})),
    ("deadline header", append(EAST_CONV, USER, extra={"x-convplane-deadline-ms": "5000"})),
    ("bad deadline header", append(EAST_CONV, USER, extra={"x-convplane-deadline-ms": "soon"})),
    ("spent deadline", append(EAST_CONV, USER, extra={"x-convplane-deadline-ms": "0"})),
    ("unknown key", append(EAST_CONV, USER, {**AUTH_A, "authorization": "Bearer nope"})),
    ("no bearer", append(EAST_CONV, USER, {**AUTH_A, "authorization": "Basic x"})),
    ("bad body", append(EAST_CONV, {"type": "message.user"})),
    ("unknown type", append(EAST_CONV, {"type": "bogus", "payload": {}})),
    ("malformed json", append(EAST_CONV, b'{"type": ')),
    ("empty body", append(EAST_CONV, b"")),
    ("not json", append(EAST_CONV, USER, {**AUTH_A, "content-type": "text/plain"})),
    ("json suffix", append(EAST_CONV, USER, {**AUTH_A, "content-type": "application/x+json"})),
    ("bad key chars", append(EAST_CONV, USER, extra={"idempotency-key": "a\tb"})),
    ("bad id", append("a%20b", USER)),
    ("dot id", append("..", USER)),
    ("query string", raw_request(f"/v1/conversations/{EAST_CONV}/events?x=1", b"{}", AUTH_A)),
    ("origin", append(EAST_CONV, USER, extra={"origin": "http://east.test"})),
    ("close", append(EAST_CONV, USER, extra={"connection": "keep-alive"})),
    *[(f"quota {i}", append(EAST_CONV, USER, AUTH_B)) for i in range(5)],
]


async def play(app: FastAPI, *, split_body: bool) -> list[WireResponse]:
    connection = WireConnection(app)
    answers = []
    for _, request in SCRIPT:
        answers += await connection.exchange(request, split_body=split_body)
    return answers


def _comparable(answer: WireResponse) -> tuple[int, list[str], dict[str, str], Any]:
    body: Any = answer.body
    if answer.headers.get("content-type") == "application/json":
        body = json.loads(answer.body)
    return answer.status, answer.header_names, answer.headers, body


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The conversation ids of the requests the lane serves, in order."""
    ids: list[str] = []
    original = fast_lane.FastLane.serve

    async def counted(self: fast_lane.FastLane, prepared: Any, respond: Any) -> None:
        ids.append(prepared.request.conversation_id)
        await original(self, prepared, respond)

    monkeypatch.setattr(fast_lane.FastLane, "serve", counted)
    return ids


async def test_the_lane_answers_every_request_as_the_app_does(served: list[str]) -> None:
    async with plane() as by_lane, plane() as by_app:
        by_app.west.fast_lane.close()  # the forward's leader serves it by its app
        laned = await play(by_lane.east, split_body=False)
        lane_count = len(served)
        apped = await play(by_app.east, split_body=True)
        assert len(served) == lane_count, "a request written in two pieces took the lane"
        for (what, _), one, other in zip(SCRIPT, laned, apped, strict=True):
            assert _comparable(one) == _comparable(other), what
        lane_metrics = await _request_metrics(by_lane.east)
        app_metrics = await _request_metrics(by_app.east)
        # the console's count of appends that entered the node, by outcome
        lane_outcomes = _console_outcomes(by_lane.east).rates().to_body()
        app_outcomes = _console_outcomes(by_app.east).rates().to_body()
    # the lane took the appends it may take (and only from the one-write connection)
    assert lane_count >= 10, served
    statuses = {what: answer.status for (what, _), answer in zip(SCRIPT, laned, strict=True)}
    assert statuses["fresh append"] == 201 and statuses["idempotent retry"] == 200
    assert statuses["forwarded to its leader"] == 201
    assert laned[SCRIPT.index(next(s for s in SCRIPT if s[0] == "forwarded to its leader"))]
    assert statuses["quota 4"] == 429 and statuses["unknown key"] == 401
    assert lane_metrics == app_metrics
    assert lane_outcomes == app_outcomes


READ_A = {"authorization": f"Bearer {KEY_A}"}


def read(
    conversation_id: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
    *,
    body: bytes | None = None,
    method: str = "GET",
) -> bytes:
    path = f"/v1/conversations/{conversation_id}"
    base = READ_A if headers is None else headers
    return raw_request(path, body, {**base, **(extra or {})}, method)


#: (what the read is, the request): in order, on one connection, after READ_SETUP
#: floats, escapes and non-ASCII text, which JSON encoders may write differently
ODD_TEXT = 'é \u2028 "q" \\ \U0001f600'
ODD = {"type": "message.user", "payload": {"content": ODD_TEXT}}
ODD_METADATA = {"n": [1e16, 1e-5, 0.1, -0.0], "text": ODD_TEXT}
READ_SETUP = [
    raw_request(
        "/v1/conversations",
        json.dumps({"conversation_id": EAST_CONV, "metadata": ODD_METADATA}).encode(),
        AUTH_A,
    ),
    create(WEST_CONV),
    append(EAST_CONV, USER),
    append(EAST_CONV, ODD),
]
READS: list[tuple[str, bytes]] = [
    ("read", read(EAST_CONV)),
    ("read led elsewhere (forwarded)", read(WEST_CONV)),
    ("unknown conversation", read("nobody-here")),
    ("deadline header", read(EAST_CONV, extra={"x-convplane-deadline-ms": "5000"})),
    ("bad deadline header", read(EAST_CONV, extra={"x-convplane-deadline-ms": "soon"})),
    ("spent deadline", read(EAST_CONV, extra={"x-convplane-deadline-ms": "0"})),
    ("unknown key", read(EAST_CONV, {"authorization": "Bearer nope"})),
    ("no bearer", read(EAST_CONV, {"authorization": "Basic x"})),
    ("no authorization", read(EAST_CONV, {})),
    ("bad id", read("a%20b")),
    ("dot id", read("..")),
    ("id too long", read("x" * 200)),
    ("query string", read(f"{EAST_CONV}?x=1")),
    ("a body", read(EAST_CONV, body=b"{}")),
    ("an empty body", read(EAST_CONV, body=b"")),
    ("a json content type", read(EAST_CONV, extra={"content-type": "application/json"})),
    ("an idempotency key", read(EAST_CONV, extra={"idempotency-key": "k1"})),
    ("a long tenant header", read(EAST_CONV, extra={"x-convplane-tenant": "t" * 200})),
    ("origin", read(EAST_CONV, extra={"origin": "http://east.test"})),
    ("another method", read(EAST_CONV, method="PUT")),
    ("events", read(f"{EAST_CONV}/events")),
    ("events page", read(f"{EAST_CONV}/events?after_seq=0&limit=1")),
    ("events page, the other order", read(f"{EAST_CONV}/events?limit=1&after_seq=1")),
    ("events after", read(f"{EAST_CONV}/events?after_seq=1")),
    ("events limit", read(f"{EAST_CONV}/events?limit=5")),
    ("events led elsewhere (forwarded)", read(f"{WEST_CONV}/events?after_seq=5")),
    ("events of nobody", read("nobody-here/events")),
    ("events of a bad id", read("../events")),
    ("events limit 0", read(f"{EAST_CONV}/events?limit=0")),
    ("events limit too big", read(f"{EAST_CONV}/events?limit=1001")),
    ("events after too big", read(f"{EAST_CONV}/events?after_seq=9999999999999999")),
    ("events repeated", read(f"{EAST_CONV}/events?limit=1&limit=2")),
    ("events unknown parameter", read(f"{EAST_CONV}/events?x=1")),
    ("events leading zero", read(f"{EAST_CONV}/events?limit=01")),
    ("events plus sign", read(f"{EAST_CONV}/events?limit=+1")),
    ("events escape", read(f"{EAST_CONV}/events?limit=%31")),
    ("events empty query", read(f"{EAST_CONV}/events?")),
    ("events with a body", read(f"{EAST_CONV}/events", body=b"")),
    ("close", read(EAST_CONV, extra={"connection": "close"})),
    *[(f"quota {i}", read(EAST_CONV, {"authorization": f"Bearer {KEY_B}"})) for i in range(5)],
]


READS_THE_LANE_TAKES = {
    "read", "read led elsewhere (forwarded)", "unknown conversation", "deadline header",
    "bad deadline header", "spent deadline", "close", *(f"quota {i}" for i in range(5)),
    "events", "events page", "events page, the other order", "events after", "events limit",
    "events led elsewhere (forwarded)", "events of nobody",
}  # fmt: skip


async def play_reads(
    app: FastAPI, *, lane: bool, served: list[str]
) -> tuple[list[WireResponse], set[str]]:
    """The answers, and the names of the reads the lane served."""
    connection = WireConnection(app, lane=lane)
    await connection.exchange(*READ_SETUP)
    answers, taken = [], set()
    for what, request in READS:
        before = len(served)
        answers += await connection.exchange(request)
        if len(served) > before:
            taken.add(what)
    return answers, taken


async def test_the_lane_answers_reads_of_a_conversation_as_the_app_does(
    served: list[str],
) -> None:
    async with plane() as by_lane, plane() as by_app:
        laned, taken = await play_reads(by_lane.east, lane=True, served=served)
        apped, none = await play_reads(by_app.east, lane=False, served=served)
        assert none == set()
        for (what, _), one, other in zip(READS, laned, apped, strict=True):
            # byte for byte: the lane writes a route's model itself
            assert (one.status, one.header_names, one.headers, one.body) == (
                other.status,
                other.header_names,
                other.headers,
                other.body,
            ), what
        lane_metrics = await _request_metrics(by_lane.east)
        app_metrics = await _request_metrics(by_app.east)
        lane_outcomes = _console_outcomes(by_lane.east).rates().to_body()
        app_outcomes = _console_outcomes(by_app.east).rates().to_body()
    statuses = {what: answer.status for (what, _), answer in zip(READS, laned, strict=True)}
    assert statuses["read"] == 200 and json.loads(laned[0].body)["last_seq"] == 2
    pages = {what: answer for (what, _), answer in zip(READS, laned, strict=True)}
    assert [e["seq"] for e in json.loads(pages["events"].body)["events"]] == [1, 2]
    assert [e["seq"] for e in json.loads(pages["events page, the other order"].body)["events"]] == [
        2
    ]
    forwarded_page = json.loads(pages["events led elsewhere (forwarded)"].body)
    assert forwarded_page == {"events": [], "next_after_seq": 5}  # the query went with it
    assert statuses["events limit 0"] == 400
    assert statuses["read led elsewhere (forwarded)"] == 200
    assert statuses["unknown conversation"] == 404 and statuses["unknown key"] == 401
    assert statuses["quota 4"] == 429
    # the lane took the reads with a tenant key, a valid id, a plain path and no body or
    # header it declines
    assert taken == READS_THE_LANE_TAKES
    assert lane_metrics == app_metrics
    assert lane_outcomes == app_outcomes


async def test_pipelined_appends_are_answered_in_order() -> None:
    async with plane() as p:
        connection = WireConnection(p.east)
        (created,) = await connection.exchange(create(EAST_CONV))
        assert created.status == 201
        answers = await connection.exchange(*(append(EAST_CONV, USER) for _ in range(4)))
        assert [a.status for a in answers] == [201] * 4
        assert [json.loads(a.body)["seq"] for a in answers] == [1, 2, 3, 4]


async def test_pipelined_reads_and_appends_are_answered_in_order() -> None:
    """Reads and appends written in one piece: the lane takes the first, the others wait their
    turn on the app's path, and every answer comes back in request order, each read seeing the
    appends before it."""
    async with plane() as p:
        connection = WireConnection(p.east)
        (created,) = await connection.exchange(create(EAST_CONV))
        assert created.status == 201
        answers = await connection.exchange(
            read(EAST_CONV),
            append(EAST_CONV, USER),
            read(f"{EAST_CONV}/events"),
            append(EAST_CONV, OTHER),
            read(EAST_CONV),
        )
        assert [a.status for a in answers] == [200, 201, 200, 201, 200]
        bodies = [json.loads(a.body) for a in answers]
        assert bodies[0]["last_seq"] == 0 and bodies[4]["last_seq"] == 2
        assert [e["seq"] for e in bodies[2]["events"]] == [1]


async def test_connection_close_is_honoured() -> None:
    async with plane() as p:
        connection = WireConnection(p.east)
        await connection.exchange(create(EAST_CONV))
        (answer,) = await connection.exchange(
            append(EAST_CONV, USER, extra={"connection": "close"})
        )
        assert answer.status == 201
        assert answer.headers["connection"] == "close"
        assert connection.transport.closed


def _console_outcomes(app: FastAPI) -> AppendOutcomes:
    """The console's window of appends that entered ``app`` (what its middleware counts)."""
    for middleware in app.user_middleware:
        outcomes = middleware.kwargs.get("outcomes")
        if isinstance(outcomes, AppendOutcomes):
            return outcomes
    raise AssertionError("the app counts no append outcomes")


async def _request_metrics(app: FastAPI) -> list[str]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://node.test"
    ) as client:
        text = (await client.get("/metrics")).text
    wanted = re.compile(
        r"^(convplane_http_requests_total|convplane_http_request_duration_seconds_count"
        r"|convplane_errors_total|convplane_admission_rejections_total)\{"
    )
    return sorted(line for line in text.splitlines() if wanted.match(line))


async def test_a_bug_is_a_500_and_a_closed_connection_as_in_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(self: SlowLog, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the log")

    answers = {}
    async with plane() as by_lane, plane() as by_app:
        for name, app, split in (("lane", by_lane.east, False), ("app", by_app.east, True)):
            connection = WireConnection(app)
            await connection.exchange(create(EAST_CONV))
            with monkeypatch.context() as patched:
                patched.setattr(SlowLog, "append_event", broken)
                (answers[name],) = await connection.exchange(
                    append(EAST_CONV, USER), split_body=split
                )
            assert connection.transport.closed, name
            admission = app.fast_lane._admission
            assert admission._inflight() == 0.0, name  # the permit went back
    assert _comparable(answers["lane"]) == _comparable(answers["app"])
    assert answers["lane"].status == 500


async def test_a_client_gone_before_its_answer_gets_none_and_leaks_nothing() -> None:
    """The connection is lost while the lane serves the append: the append still commits (its
    outcome was the client's to ask for again), nothing is written to the dead transport, the
    admission permit comes back and the request is counted once."""
    async with plane() as p:
        connection = WireConnection(p.east)
        await connection.exchange(create(EAST_CONV))
        connection.protocol.data_received(append(EAST_CONV, USER, extra={"idempotency-key": "g"}))
        connection.protocol.connection_lost(None)
        for _ in range(1000):
            await asyncio.sleep(0)
        assert connection.transport.written == b""
        admission = p.east.fast_lane._admission
        assert admission._inflight() == 0.0
        again = WireConnection(p.east)
        (retry,) = await again.exchange(append(EAST_CONV, USER, extra={"idempotency-key": "g"}))
        assert retry.status == 200 and retry.headers["idempotent-replayed"] == "true"
        assert json.loads(retry.body)["seq"] == 1
        outcomes = _console_outcomes(p.east).rates().to_body()
    assert outcomes["received_per_s"] > 0


@pytest.mark.parametrize("first", ["append", "transcript read"])
async def test_a_request_arriving_while_the_lanes_answer_is_pending_waits_its_turn(
    monkeypatch: pytest.MonkeyPatch, served: list[str], first: str
) -> None:
    """HTTP/1.1 pipelining across packets: a second request arrives, in a later write, while
    the lane still serves the first (an append, or a read of the transcript). It goes the app's
    way, after the first, and the answers leave in the order the requests came."""
    gate = asyncio.Event()

    async def stalled(self: SlowLog) -> None:
        self.entered += 1
        await gate.wait()

    async with plane() as p:
        connection = WireConnection(p.east)
        await connection.exchange(create(EAST_CONV))
        monkeypatch.setattr(SlowLog, "_maybe_stall", stalled)
        if first == "append":
            connection.protocol.data_received(
                append(EAST_CONV, USER, extra={"idempotency-key": "1"})
            )
        else:
            connection.protocol.data_received(read(f"{EAST_CONV}/events"))
        for _ in range(200):
            await asyncio.sleep(0)
        assert (
            connection.protocol.cycle is not None
            and not connection.protocol.cycle.response_complete
        )
        connection.protocol.data_received(append(EAST_CONV, OTHER, extra={"idempotency-key": "2"}))
        for _ in range(200):
            await asyncio.sleep(0)
        assert connection.transport.written == b""  # the first is still under way
        gate.set()
        answers: list[WireResponse] = []
        for _ in range(10_000):
            answers += connection._read()
            if len(answers) == 2:
                break
            await asyncio.sleep(0)
    if first == "append":
        assert [a.status for a in answers] == [201, 201]
        assert [json.loads(a.body)["seq"] for a in answers] == [1, 2]
    else:  # the read was answered before the append it came before
        assert [a.status for a in answers] == [200, 201]
        assert json.loads(answers[0].body)["events"] == []
        assert json.loads(answers[1].body)["seq"] == 1
    assert served == [EAST_CONV]  # the lane took the first; the app served the second


# --- forwarded appends: the leader's lane serves a forward batch's items ------------------------


def forwarded(
    conversation_id: str,
    event: Any,
    key: str | None = None,
    authorization: str = f"Bearer {KEY_A}",
    deadline_ms: int = 5_000,
) -> dict[str, Any]:
    """One item of a forward batch, as an entry node sends it."""
    body = event if isinstance(event, str) else json.dumps(event)
    return {
        "conversation_id": conversation_id,
        "authorization": authorization,
        "idempotency_key": key,
        "deadline_ms": deadline_ms,
        "body": body,
    }


WEST_CONV_B = conversation_led_by("west", prefix="b")  # tenant B's (quota: a burst of 3)
#: (what the item is, the item): sent to west (WEST_CONV's leader) one batch each, in order
FORWARDED_SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("fresh append", forwarded(WEST_CONV, USER, key="k1")),
    ("idempotent retry", forwarded(WEST_CONV, USER, key="k1")),
    ("key reused", forwarded(WEST_CONV, OTHER, key="k1")),
    ("no key", forwarded(WEST_CONV, USER)),
    ("seq conflict", forwarded(WEST_CONV, {**USER, "expected_seq": 9})),
    ("tool attempt", forwarded(WEST_CONV, ATTEMPT)),
    ("tool effect", forwarded(WEST_CONV, EFFECT_OK)),
    ("effect conflict", forwarded(WEST_CONV, EFFECT_FAILED)),
    ("unknown conversation", forwarded("nobody-here", USER)),
    ("led elsewhere", forwarded(EAST_CONV, USER)),
    ("unknown key", forwarded(WEST_CONV, USER, authorization="Bearer nope")),
    ("no bearer", forwarded(WEST_CONV, USER, authorization="Basic x")),
    ("bad body", forwarded(WEST_CONV, {"type": "message.user"})),
    ("unknown type", forwarded(WEST_CONV, {"type": "bogus", "payload": {}})),
    ("malformed json", forwarded(WEST_CONV, '{"type": ')),
    ("empty body", forwarded(WEST_CONV, "")),
    ("bad key chars", forwarded(WEST_CONV, USER, key="a\tb")),
    ("dot id", forwarded("..", USER)),
    ("short deadline", forwarded(WEST_CONV, USER, deadline_ms=1)),
    *[(f"unmetered {i}", forwarded(WEST_CONV_B, USER, authorization=f"Bearer {KEY_B}"))
      for i in range(5)],
]  # fmt: skip


async def peer_call(app: FastAPI, path: str, body: Any) -> httpx.Response:
    """A POST from east through ``app``'s peer listener."""
    async with httpx.AsyncClient(
        transport=peer_listener(app, cluster(SECRET)), base_url="http://west.test"
    ) as client:
        headers = {PEER_AUTH_HEADER: SECRET, "X-Convplane-Source-Region": "east"}
        return await client.post(path, json=body, headers=headers)


async def play_forwarded(app: FastAPI) -> list[Any]:
    """Each item in a batch of its own; the answer line of each (or the batch's refusal)."""
    answers: list[Any] = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://west.test"
    ) as client:
        created = await client.post(
            "/v1/conversations", json={"conversation_id": WEST_CONV}, headers=AUTH_A
        )
        assert created.status_code == 201, created.text
        created = await client.post(
            "/v1/conversations", json={"conversation_id": WEST_CONV_B}, headers=AUTH_B
        )
        assert created.status_code == 201, created.text
        for _, item in FORWARDED_SCRIPT:
            reply = await peer_call(app, BATCH_PATH, {"items": [item]})
            if reply.status_code != 200:
                answers.append((reply.status_code, reply.json()))
                continue
            (line,) = [json.loads(x) for x in reply.text.splitlines()]
            line["body"] = json.loads(line["body"]) if line["body"] else line["body"]
            answers.append(line)
    return answers


async def test_the_leaders_lane_answers_forwarded_appends_as_its_app_does(
    served: list[str],
) -> None:
    async with plane() as by_lane, plane() as by_app:
        by_app.west.fast_lane.close()  # every item through the app
        laned = await play_forwarded(by_lane.west)
        lane_count = len(served)
        apped = await play_forwarded(by_app.west)
        assert len(served) == lane_count, "the closed lane served an item"
        for (what, _), one, other in zip(FORWARDED_SCRIPT, laned, apped, strict=True):
            assert one == other, what
        assert await _request_metrics(by_lane.west) == await _request_metrics(by_app.west)
        lane_outcomes = _console_outcomes(by_lane.west).rates().to_body()
        assert lane_outcomes == _console_outcomes(by_app.west).rates().to_body()
    statuses = {
        what: answer["status"] if isinstance(answer, dict) else answer[0]
        for (what, _), answer in zip(FORWARDED_SCRIPT, laned, strict=True)
    }
    assert statuses["fresh append"] == 201 and statuses["idempotent retry"] == 200
    assert statuses["key reused"] == 409 and statuses["led elsewhere"] == 503
    assert statuses["unknown key"] == 401 and statuses["malformed json"] == 400
    assert [statuses[f"unmetered {i}"] for i in range(5)] == [201] * 5  # charged at entry
    # the lane took every well-formed item; the app words every refusal of a malformed one
    assert lane_count == 16, served


async def play_shedding(p: Plane) -> list[Any]:
    """West's one permit held by a client's append the log holds, room for one in its queue:
    a forwarded item queued past its deadline (503 ``overloaded``); then a batch of three, the
    first queued (served once the permit frees), the others finding the queue full (503
    ``overloaded``). The answer lines, batch by batch, in item order."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=p.west), base_url="http://west.test"
    ) as client:

        async def batch(*items: dict[str, Any]) -> list[dict[str, Any]]:
            reply = await peer_call(p.west, BATCH_PATH, {"items": list(items)})
            assert reply.status_code == 200, reply.text
            lines = sorted((json.loads(x) for x in reply.text.splitlines()), key=_index)
            for line in lines:
                line["body"] = json.loads(line["body"])
            return lines

        created = await client.post(
            "/v1/conversations", json={"conversation_id": WEST_CONV}, headers=AUTH_A
        )
        assert created.status_code == 201, created.text
        p.west_log.gate.clear()
        entered = p.west_log.entered
        held = asyncio.create_task(
            client.post(f"/v1/conversations/{WEST_CONV}/events", json=USER, headers=AUTH_A)
        )
        await until(lambda: p.west_log.entered == entered + 1)
        late = asyncio.create_task(batch(forwarded(WEST_CONV, USER, key="q", deadline_ms=50)))
        await until_metric(client, "convplane_admission_queue_length", 1)
        p.clock.now_s += 1.0  # its deadline passes while it waits
        answers = await late
        crowded = asyncio.create_task(
            batch(
                forwarded(WEST_CONV, USER, key="w"),
                forwarded(WEST_CONV, OTHER, key="s1"),
                forwarded(WEST_CONV, OTHER),
            )
        )
        await until_metric(client, "convplane_admission_queue_length", 1)
        await until_shed(client, 2)  # the two that found the queue full
        p.west_log.gate.set()
        answers += await crowded
        assert (await held).status_code == 201
        assert p.west_log.entered == entered + 2  # the held append and the queued item
        assert await metric_value(client, "convplane_admission_in_flight") == 0
    return answers


async def until_shed(client: httpx.AsyncClient, count: int) -> None:
    shed = f'convplane_admission_rejections_total{{reason="overloaded"}} {count}.0'
    for _ in range(1_000):
        if shed in (await client.get("/metrics")).text:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never {count} overloaded")


def _index(line: dict[str, Any]) -> int:
    return int(line["index"])


async def test_a_shedding_leader_answers_forwarded_items_as_its_app_does(
    served: list[str],
) -> None:
    limits = {"admission_limit_initial": 1, "admission_limit_min": 1, "admission_queue_max": 1}
    async with plane(**limits) as by_lane, plane(**limits) as by_app:
        by_app.west.fast_lane.close()  # every item through the app
        laned = await play_shedding(by_lane)
        apped = await play_shedding(by_app)
        assert laned == apped
        assert await _request_metrics(by_lane.west) == await _request_metrics(by_app.west)
    assert [a["status"] for a in laned] == [503, 201, 503, 503]
    refused = [a for a in laned if a["status"] == 503]
    assert {a["body"]["error"]["code"] for a in refused} == {"overloaded"}
    assert all(a["headers"].get("retry-after") for a in refused)
    assert len(served) == 4  # the lane took every item of the open plane (its admission shed)

"""Forwarded appends travel in batches (``services.api.forward_batch``) and each one gets the
answer it would have got forwarded alone: the leader's status, body and headers. A lost
forward, batched or alone, is sent again when the append carries an Idempotency-Key."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from eventlog.clock import LoopClock
from services.api.forward_batch import BATCH_BODY_BYTES_MAX, BATCH_PATH
from services.api.forward_exchange import NDJSON
from services.bootstrap import NodeRuntime
from services.bootstrap.app import create_app
from services.config import ClusterConfig, NodeSettings
from tests.unit.api_fakes import (
    KEY_A,
    FakeLog,
    HostRouting,
    cluster_config,
    conversation_led_by,
    leaders,
    peer_listener,
)

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
PEER_SECRET = "peer-secret-for-tests"


class CountingRouting(HostRouting):
    """The peer transport, counting what each node sends to another, by path."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


@dataclass
class Nodes:
    east: httpx.AsyncClient
    west: httpx.AsyncClient
    west_log: FakeLog
    routing: CountingRouting


def _cluster() -> ClusterConfig:
    return cluster_config().model_copy(update={"peer_secret": PEER_SECRET})


def _app(region: str, log: FakeLog, peers: httpx.AsyncClient, **limits: object) -> FastAPI:
    cluster = _cluster()
    settings = NodeSettings(region=region, cluster=cluster, **limits)  # type: ignore[arg-type]

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        yield NodeRuntime(
            region, s.load_cluster(), log, peers, LoopClock(), random.Random(7), lambda: (4, 4)
        )

    return create_app(settings, runtime_factory=runtime)


@asynccontextmanager
async def two_nodes(**settings: object) -> AsyncIterator[Nodes]:
    """East and west, each led shard's appends forwarded in batches to its leader."""
    routing = CountingRouting()
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=routing))
        west_log = FakeLog("west", leaders())
        limits = {
            "forward_batches_in_flight_max": 1,
            "forward_batch_max": 8,
            "forward_batch_straggler_s": 0.05,
            **settings,
        }
        apps = {
            "east.test": _app("east", FakeLog("east", leaders()), peers, **limits),
            "west.test": _app("west", west_log, peers, **limits),
        }
        routing.apps = {host: peer_listener(app, _cluster()) for host, app in apps.items()}
        clients = []
        for host, app in apps.items():
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            clients.append(
                await stack.enter_async_context(
                    httpx.AsyncClient(transport=transport, base_url=f"http://{host}")
                )
            )
        yield Nodes(clients[0], clients[1], west_log, routing)


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    async with two_nodes() as both:
        yield both


async def _create(nodes: Nodes, conversation_id: str) -> None:
    r = await nodes.west.post(
        "/v1/conversations", json={"conversation_id": conversation_id}, headers=AUTH_A
    )
    assert r.status_code == 201, r.text


async def test_concurrent_appends_to_one_leader_share_batches(nodes: Nodes) -> None:
    cids = [conversation_led_by("west", prefix=f"b{i}") for i in range(20)]
    for cid in cids:
        await _create(nodes, cid)
    nodes.routing.paths.clear()
    answers = await asyncio.gather(
        *(
            nodes.east.post(
                f"/v1/conversations/{cid}/events",
                json={"type": "message.user", "payload": {"content": f"hello {cid}"}},
                headers={**AUTH_A, "Idempotency-Key": f"k-{cid}"},
            )
            for cid in cids
        )
    )
    assert [r.status_code for r in answers] == [201] * len(cids), [r.text for r in answers]
    assert {r.headers["x-convplane-served-by"] for r in answers} == {"west"}
    assert [r.json()["seq"] for r in answers] == [1] * len(cids)
    for cid in cids:
        (event,) = nodes.west_log.convs[("a", cid)].events
        assert event.payload == {"content": f"hello {cid}"}
    # every append went in a batch, and batches held more than one
    assert set(nodes.routing.paths) == {BATCH_PATH}
    assert 1 < len(nodes.routing.paths) < len(cids)


async def test_each_item_gets_its_own_answer(nodes: Nodes) -> None:
    first, second = (conversation_led_by("west", prefix=p) for p in ("x", "y"))
    for cid in (first, second):
        await _create(nodes, cid)
    url = f"/v1/conversations/{first}/events"
    committed = await nodes.east.post(
        url, json={"type": "note"}, headers={**AUTH_A, "Idempotency-Key": "once"}
    )
    assert committed.status_code == 201, committed.text
    replayed, conflict, missing = await asyncio.gather(
        nodes.east.post(url, json={"type": "note"}, headers={**AUTH_A, "Idempotency-Key": "once"}),
        nodes.east.post(
            f"/v1/conversations/{second}/events",
            json={"type": "note", "expected_seq": 5},
            headers=AUTH_A,
        ),
        nodes.east.post(
            f"/v1/conversations/{conversation_led_by('west', prefix='none')}/events",
            json={"type": "note"},
            headers=AUTH_A,
        ),
    )
    assert (replayed.status_code, replayed.headers["idempotent-replayed"]) == (200, "true")
    assert replayed.json() == committed.json()
    assert (conflict.status_code, conflict.json()["error"]["code"]) == (409, "seq_conflict")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert {r.headers["x-convplane-served-by"] for r in (replayed, conflict, missing)} == {"west"}


async def test_an_item_past_its_deadline_is_outcome_unknown(nodes: Nodes) -> None:
    cid = conversation_led_by("west")
    await _create(nodes, cid)
    nodes.west_log.stall = True
    r = await nodes.east.post(
        f"/v1/conversations/{cid}/events",
        json={"type": "note"},
        headers={**AUTH_A, "X-Convplane-Deadline-Ms": "200"},
    )
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "outcome_unknown"
    assert r.headers["retry-after"]


async def test_the_batch_endpoint_serves_peers_the_peer_listener_authenticated_only(
    nodes: Nodes,
) -> None:
    item = {
        "conversation_id": conversation_led_by("west"),
        "authorization": f"Bearer {KEY_A}",
        "deadline_ms": 1000,
        "body": '{"type": "note"}',
    }
    peer = {"X-Convplane-Peer-Auth": PEER_SECRET, "X-Convplane-Source-Region": "east"}
    # straight to the app (as the client listener would pass it), the secret grants nothing
    for headers in ({}, peer):
        r = await nodes.west.post(BATCH_PATH, json={"items": [item]}, headers=headers)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
    async with httpx.AsyncClient(transport=nodes.routing) as through_the_peer_listener:
        r = await through_the_peer_listener.post(
            "http://west.test" + BATCH_PATH, json={"items": []}, headers=peer
        )
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_request")


async def test_an_unreachable_leader_fails_every_item_as_forward_failed(nodes: Nodes) -> None:
    cid = conversation_led_by("west")
    await _create(nodes, cid)
    del nodes.routing.apps["west.test"]
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                              headers=AUTH_A)  # fmt: skip
    assert (r.status_code, r.json()["error"]["code"]) == (503, "forward_failed")
    assert r.headers["x-convplane-served-by"] == "east"


def _connections_time_out(routing: CountingRouting, host: str) -> list[float]:
    """Every connection to ``host`` fails as one not made in time; returns when each was tried."""
    tried: list[float] = []

    async def connect_times_out(request: httpx.Request) -> httpx.Response:
        tried.append(asyncio.get_running_loop().time())
        raise httpx.ConnectTimeout("no connection in time", request=request)

    routing.apps[host] = httpx.MockTransport(connect_times_out)  # type: ignore[assignment]
    return tried


async def test_a_leader_never_connected_to_is_forward_failed(nodes: Nodes) -> None:
    """A connection that timed out never carried the batch: it is retried like a refused one,
    and the answer is 503 ``forward_failed`` (not applied), not ``outcome_unknown``."""
    cid = conversation_led_by("west")
    await _create(nodes, cid)
    west = nodes.routing.apps["west.test"]
    tried = _connections_time_out(nodes.routing, "west.test")
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                              headers=AUTH_A)  # fmt: skip
    assert (r.status_code, r.json()["error"]["code"]) == (503, "forward_failed"), r.text
    assert len(tried) == 2  # the first attempt and forward_retries_max (1) more
    nodes.routing.apps["west.test"] = west
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                              headers=AUTH_A)  # fmt: skip
    assert (r.status_code, r.json()["seq"]) == (201, 1)  # nothing of the first was applied


async def test_a_deadline_passing_before_anything_left_is_deadline_exceeded() -> None:
    """Its deadline passed while every attempt so far made no connection: 504
    ``deadline_exceeded`` (not applied), and no later attempt of the batch carries it."""
    async with two_nodes(forward_retries_max=5, forward_backoff_s=5.0) as nodes:
        cid = conversation_led_by("west")
        await _create(nodes, cid)
        west = nodes.routing.apps["west.test"]
        tried = _connections_time_out(nodes.routing, "west.test")
        r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                                  headers={**AUTH_A, "X-Convplane-Deadline-Ms": "200"})  # fmt: skip
        assert (r.status_code, r.json()["error"]["code"]) == (504, "deadline_exceeded"), r.text
        assert "not applied" in r.json()["error"]["message"]
        assert len(tried) == 1  # the backoff (5 s) outlasted the deadline
        nodes.routing.apps["west.test"] = west
        await asyncio.sleep(0.05)  # a batch still holding it would try again now
        assert len(tried) == 1
        r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                                  headers=AUTH_A)  # fmt: skip
        assert (r.status_code, r.json()["seq"]) == (201, 1)


async def test_an_item_answered_not_applied_never_leaves_with_its_batch() -> None:
    """Two items share a batch whose connections time out; the first one's deadline passes
    during the backoff (504, not applied), and the batch's next attempt carries only the
    other: the leader never sees the first."""
    async with two_nodes(forward_retries_max=5, forward_backoff_s=2.0) as nodes:
        first, short, long = (conversation_led_by("west", prefix=p) for p in ("x", "a", "b"))
        for cid in (first, short, long):
            await _create(nodes, cid)
        west = nodes.routing.apps["west.test"]
        tried = _connections_time_out(nodes.routing, "west.test")

        async def append(cid: str, deadline_ms: int, after_s: float) -> httpx.Response:
            await asyncio.sleep(after_s)
            return await nodes.east.post(
                f"/v1/conversations/{cid}/events", json={"type": "note"},
                headers={**AUTH_A, "X-Convplane-Deadline-Ms": str(deadline_ms)},
            )  # fmt: skip

        async def restore_west(after_s: float) -> None:
            await asyncio.sleep(after_s)
            nodes.routing.apps["west.test"] = west

        # the first batch ([first]) waits out its backoff; after the straggler time (50 ms)
        # the second ([short, long]) leaves, fails too, and waits its own backoff (>= 1 s)
        answers = await asyncio.gather(
            append(first, 60_000, 0.0),
            append(short, 200, 0.01),
            append(long, 60_000, 0.01),
            restore_west(0.5),
        )
        r_first, r_short, r_long = answers[:3]
        assert len(tried) == 2  # two batches, one failed attempt each
        assert (r_short.status_code, r_short.json()["error"]["code"]) == (504, "deadline_exceeded")
        assert (r_first.status_code, r_first.json()["seq"]) == (201, 1)
        assert (r_long.status_code, r_long.json()["seq"]) == (201, 1)
        r = await nodes.east.post(f"/v1/conversations/{short}/events", json={"type": "note"},
                                  headers=AUTH_A)  # fmt: skip
        assert (r.status_code, r.json()["seq"]) == (201, 1)  # the withdrawn item never landed


def _stall_appends(log: FakeLog, conversation_id: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Appends to ``conversation_id`` at ``log`` wait, once they arrive (``reached``), until
    ``release`` is set."""
    reached, release = asyncio.Event(), asyncio.Event()
    append = log.append_event

    async def stalling(tenant_id: str, cid: str, *args: Any, **kw: Any) -> Any:
        if cid == conversation_id:
            reached.set()
            await release.wait()
        return await append(tenant_id, cid, *args, **kw)

    log.append_event = stalling  # type: ignore[method-assign,assignment]
    return reached, release


async def test_a_batch_waiting_on_a_slow_item_does_not_hold_the_next_one(nodes: Nodes) -> None:
    slow, fast = (conversation_led_by("west", prefix=p) for p in ("slow", "fast"))
    for cid in (slow, fast):
        await _create(nodes, cid)
    reached, release = _stall_appends(nodes.west_log, slow)
    # one batch under way per peer: without the straggler rule the second append would wait
    # for the first one's batch, i.e. until the first one's deadline (5 s) answered it 503
    first = asyncio.create_task(
        nodes.east.post(
            f"/v1/conversations/{slow}/events",
            json={"type": "note"},
            headers={**AUTH_A, "X-Convplane-Deadline-Ms": "5000"},
        )
    )
    await reached.wait()  # the first append's batch is under way at the leader
    second = await nodes.east.post(
        f"/v1/conversations/{fast}/events", json={"type": "note"}, headers=AUTH_A
    )
    assert second.status_code == 201, second.text
    assert not first.done()
    release.set()
    assert (await first).status_code == 201


async def test_a_bug_serving_one_item_is_its_500_and_no_other_items(nodes: Nodes) -> None:
    broken, fine = (conversation_led_by("west", prefix=p) for p in ("broken", "fine"))
    for cid in (broken, fine):
        await _create(nodes, cid)
    append = nodes.west_log.append_event

    async def failing(tenant_id: str, conversation_id: str, *args: Any, **kw: Any) -> Any:
        if conversation_id == broken:
            raise RuntimeError("a bug")
        return await append(tenant_id, conversation_id, *args, **kw)

    nodes.west_log.append_event = failing  # type: ignore[method-assign]
    answers = await asyncio.gather(
        *(
            nodes.east.post(
                f"/v1/conversations/{cid}/events", json={"type": "note"}, headers=AUTH_A
            )
            for cid in (broken, fine)
        )
    )
    assert [r.status_code for r in answers] == [500, 201]


def _answers_lost(
    routing: CountingRouting,
    host: str,
    lost: set[int],
    refused_from: int | None = None,
    canned: dict[int, httpx.Response] | None = None,
) -> list[httpx.Request]:
    """The calls to ``host`` numbered in ``lost`` (from 1) reach its app, which serves them,
    and then lose their answer (the connection breaks); from call ``refused_from`` on, no
    connection is made; a call numbered in ``canned`` gets that answer instead of the app's.
    Returns the calls."""
    app = routing.apps[host]
    carried: list[httpx.Request] = []

    async def lose_some(request: httpx.Request) -> httpx.Response:
        carried.append(request)
        if refused_from is not None and len(carried) >= refused_from:
            raise httpx.ConnectError("refused", request=request)
        if canned is not None and len(carried) in canned:
            return canned[len(carried)]
        reply = await app.handle_async_request(request)
        await reply.aread()  # every item served
        if len(carried) in lost:
            raise httpx.ReadError("connection reset by peer", request=request)
        return reply

    routing.apps[host] = httpx.MockTransport(lose_some)  # type: ignore[assignment]
    return carried


def _error(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": code}})


def _ndjson(*lines: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": NDJSON}, content=b"".join(lines))


def _batch_items(calls: list[httpx.Request]) -> list[list[str]]:
    """Each forward batch's items, by conversation id."""
    return [[item["conversation_id"] for item in json.loads(c.content)["items"]] for c in calls]


async def _seqs(nodes: Nodes, conversation_id: str) -> list[int]:
    events = await nodes.west.get(f"/v1/conversations/{conversation_id}/events", headers=AUTH_A)
    return [e["seq"] for e in events.json()["events"]]


async def test_a_lost_batch_sends_its_keyed_items_again_and_each_is_applied_once() -> None:
    """A batch whose connection broke after the leader served it: the item with an
    Idempotency-Key goes again, alone, and gets the result the leader already holds (200,
    replayed); the one without a key is ``outcome_unknown`` (sent again it would be applied
    twice). Each is in the log once."""
    async with two_nodes(forward_batch_straggler_s=0.05, forward_retries_max=2) as nodes:
        slow, keyed, plain = (conversation_led_by("west", prefix=p) for p in ("s", "k", "p"))
        for cid in (slow, keyed, plain):
            await _create(nodes, cid)
        reached, release = _stall_appends(nodes.west_log, slow)
        carried = _answers_lost(nodes.routing, "west.test", lost={2})

        def post(cid: str, headers: dict[str, str]) -> Any:
            return nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                                   headers={**AUTH_A, **headers})  # fmt: skip

        first = asyncio.create_task(post(slow, {}))
        await reached.wait()  # its batch stays under way: the next two queue and share one
        r_keyed, r_plain = await asyncio.gather(
            post(keyed, {"Idempotency-Key": "k-1"}), post(plain, {})
        )
        release.set()
        assert (await first).status_code == 201
        assert _batch_items(carried)[:3] == [[slow], [keyed, plain], [keyed]]
        assert r_keyed.status_code == 200, r_keyed.text
        assert r_keyed.headers["idempotent-replayed"] == "true"
        assert (r_keyed.json()["seq"], r_keyed.headers["x-convplane-served-by"]) == (1, "west")
        assert (r_plain.status_code, r_plain.json()["error"]["code"]) == (503, "outcome_unknown")
        for cid in (keyed, plain):  # applied once each: the lost attempt's doing
            assert await _seqs(nodes, cid) == [1]


_ATTEMPT = {
    "type": "tool.attempt",
    "payload": {"attempt_id": "a-1", "tool": "search", "argument_digest": "sha256:1"},
}
_EFFECT = {"type": "tool.effect", "payload": {"attempt_id": "a-1", "status": "committed"}}


@pytest.mark.parametrize("alone", [False, True], ids=["in a batch", "forwarded alone"])
@pytest.mark.parametrize("event", [_ATTEMPT, _EFFECT], ids=["tool.attempt", "tool.effect"])
async def test_a_lost_tool_event_is_sent_again_without_a_key(
    event: dict[str, Any], alone: bool
) -> None:
    """A tool event's ``attempt_id`` identifies it for the conversation's life, and the log
    answers an identical repeat with the first one's result: a lost forward of one (in a batch,
    or alone: UTF-16 JSON) is sent again with no Idempotency-Key, gets the result the leader
    holds, and is in the log once."""
    async with two_nodes(forward_retries_max=2, forward_backoff_s=0.01) as nodes:
        cid = conversation_led_by("west")
        await _create(nodes, cid)
        url = f"/v1/conversations/{cid}/events"
        if event is _EFFECT:  # its attempt first, at the leader
            assert (await nodes.west.post(url, json=_ATTEMPT, headers=AUTH_A)).status_code == 201
        carried = _answers_lost(nodes.routing, "west.test", {1})
        body = json.dumps(event).encode("utf-16" if alone else "utf-8")
        r = await nodes.east.post(
            url, content=body, headers={**AUTH_A, "content-type": "application/json"}
        )
        assert r.status_code == 200, r.text
        assert r.headers["idempotent-replayed"] == "true"
        assert len(carried) == 2  # the lost attempt and its repeat
        events = (await nodes.west.get(url, headers=AUTH_A)).json()["events"]
        types = ["tool.attempt", "tool.effect"] if event is _EFFECT else ["tool.attempt"]
        assert [e["type"] for e in events] == types


@pytest.mark.parametrize("then", ["lost again", "refused"])
async def test_a_keyed_item_lost_once_is_never_answered_not_applied(then: str) -> None:
    """Its first attempt was lost after the leader applied it; every later attempt fails
    (lost again, or no connection at all): the answer is ``outcome_unknown``, never
    ``forward_failed`` (which says "not applied")."""
    async with two_nodes(forward_retries_max=1, forward_backoff_s=0.01) as nodes:
        cid = conversation_led_by("west")
        await _create(nodes, cid)
        lost, refused_from = ({1, 2}, None) if then == "lost again" else ({1}, 2)
        carried = _answers_lost(nodes.routing, "west.test", lost, refused_from)
        r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                                  headers={**AUTH_A, "Idempotency-Key": "k-1"})  # fmt: skip
        assert (r.status_code, r.json()["error"]["code"]) == (503, "outcome_unknown"), r.text
        assert _batch_items(carried) == [[cid], [cid]]  # forward_retries_max (1) more
        assert await _seqs(nodes, cid) == [1]


@pytest.mark.parametrize(
    ("keyed", "then", "answer", "calls"),
    [
        (True, "answered", (200, "replayed"), 2),
        (True, "refused", (503, "outcome_unknown"), 2),
        (True, "busy", (503, "outcome_unknown"), 2),
        (False, "answered", (503, "outcome_unknown"), 1),
    ],
)
async def test_a_lost_single_forward_of_a_keyed_append_is_sent_again(
    keyed: bool, then: str, answer: tuple[int, str], calls: int
) -> None:
    """An append that travels alone (UTF-16 JSON, which a batch does not carry) is served by
    the leader and its answer lost: with an Idempotency-Key it is sent again and answered with
    the result the leader holds, or ``outcome_unknown`` if that attempt finds no connection
    (never ``forward_failed``, "not applied") or is refused for the moment (the leader's 504
    says nothing of the first); without a key it is ``outcome_unknown`` at once. Applied once."""
    async with two_nodes(forward_retries_max=1, forward_backoff_s=0.01) as nodes:
        cid = conversation_led_by("west")
        await _create(nodes, cid)
        refused_from = 2 if then == "refused" else None
        canned = {2: _error(504, "deadline_exceeded")} if then == "busy" else None
        carried = _answers_lost(nodes.routing, "west.test", {1}, refused_from, canned)
        headers = {**AUTH_A, "content-type": "application/json"}
        if keyed:
            headers["Idempotency-Key"] = "k-1"
        body = json.dumps({"type": "note"}).encode("utf-16")
        r = await nodes.east.post(f"/v1/conversations/{cid}/events", content=body,
                                  headers=headers)  # fmt: skip
        if r.status_code == 200:
            assert (r.status_code, "replayed") == answer
            assert r.headers["idempotent-replayed"] == "true"
        else:
            assert (r.status_code, r.json()["error"]["code"]) == answer, r.text
        assert [c.url.path for c in carried] == [f"/v1/conversations/{cid}/events"] * calls
        assert await _seqs(nodes, cid) == [1]


def _line(index: object = 0, status: object = 201, code: str = "") -> bytes:
    body = json.dumps({"error": {"code": code}}) if code else "{}"
    line = {"index": index, "status": status, "headers": {}, "body": body}
    return json.dumps(line).encode() + b"\n"


@pytest.mark.parametrize(
    ("resend_answer", "answer", "calls"),
    [
        (_ndjson(_line(status=504, code="deadline_exceeded")), (503, "outcome_unknown"), 2),
        (_ndjson(_line(status=404, code="not_found")), (503, "outcome_unknown"), 2),
        (_ndjson(_line(status=400, code="invalid_request")), (400, "invalid_request"), 2),
        (_error(503, "overloaded"), (503, "outcome_unknown"), 2),  # the batch's refusal
        (_ndjson(b"not json\n"), (200, "replayed"), 3),  # lost again: a third attempt
        (_ndjson(_line(index=-1)), (200, "replayed"), 3),
        (_ndjson(_line(status=42)), (200, "replayed"), 3),
    ],
    ids=[
        "item refused for the moment",
        "item not found (its creation may be under way)",
        "item refused for its bytes",
        "batch refused",
        "answer line not JSON",
        "answer line for no item",
        "answer line with a status no HTTP has",
    ],
)
async def test_a_resent_items_answer_stands_only_if_it_settles_the_lost_attempt(
    resend_answer: httpx.Response, answer: tuple[int, str], calls: int
) -> None:
    """The keyed item of a lost batch is sent again; the leader's answer to the repeat is its
    answer only when it settles what became of the lost attempt (the first was applied here):
    a refusal of its bytes (400) does; a 504, a 404 or a batch's 503 refusal say nothing of it,
    and it is ``outcome_unknown``; a malformed answer line loses the batch again, and the next
    attempt gets the result."""
    async with two_nodes(forward_retries_max=2, forward_backoff_s=0.01) as nodes:
        cid = conversation_led_by("west")
        await _create(nodes, cid)
        carried = _answers_lost(nodes.routing, "west.test", {1}, canned={2: resend_answer})
        r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"},
                                  headers={**AUTH_A, "Idempotency-Key": "k-1"})  # fmt: skip
        if r.status_code == 200:
            assert (200, "replayed") == answer
            assert r.headers["idempotent-replayed"] == "true"
        else:
            assert (r.status_code, r.json()["error"]["code"]) == answer, r.text
        assert _batch_items(carried) == [[cid]] * calls
        assert await _seqs(nodes, cid) == [1]


async def test_a_batch_body_past_its_limit_is_refused_before_its_handler(nodes: Nodes) -> None:
    """Every route has a body limit, the peer endpoints included (issue 39): an authenticated
    peer's oversized batch is a 413, never parsed."""
    peer = {
        "X-Convplane-Peer-Auth": PEER_SECRET,
        "X-Convplane-Source-Region": "east",
        "content-type": "application/json",
    }
    async with httpx.AsyncClient(transport=nodes.routing) as through_the_peer_listener:
        r = await through_the_peer_listener.post(
            "http://west.test" + BATCH_PATH, content=b" " * (BATCH_BODY_BYTES_MAX + 1), headers=peer
        )
    assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")

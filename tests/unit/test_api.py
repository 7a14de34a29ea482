"""The public API over a fake log: auth, scoping, errors, limits, deadlines, forwarding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from tests.unit.api_fakes import (
    KEY_A,
    KEY_B,
    FakeLog,
    HostRouting,
    build_app,
    cluster_with_peer_secret,
    conversation_led_by,
    leaders,
    peer_listener,
)

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
AUTH_B = {"Authorization": f"Bearer {KEY_B}"}


@dataclass
class Nodes:
    east: httpx.AsyncClient
    west: httpx.AsyncClient
    east_log: FakeLog
    west_log: FakeLog
    routing: HostRouting


async def _start(stack: AsyncExitStack, app: FastAPI, host: str) -> httpx.AsyncClient:
    await stack.enter_async_context(app.router.lifespan_context(app))
    transport = httpx.ASGITransport(app=app)
    return await stack.enter_async_context(
        httpx.AsyncClient(transport=transport, base_url=f"http://{host}")
    )


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    routing = HostRouting()
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=routing))
        east_log, west_log = FakeLog("east", leaders()), FakeLog("west", leaders())
        cluster = cluster_with_peer_secret()
        limits = {"max_body_bytes": 4096, "max_metadata_bytes": 1024}
        east_app = build_app("east", east_log, peers, cluster, **limits)
        west_app = build_app("west", west_log, peers, cluster, **limits)
        routing.apps = {
            "east.test": peer_listener(east_app, cluster),
            "west.test": peer_listener(west_app, cluster),
        }
        east = await _start(stack, east_app, "east.test")
        west = await _start(stack, west_app, "west.test")
        yield Nodes(east, west, east_log, west_log, routing)


async def _create(client: httpx.AsyncClient, cid: str, auth: dict[str, str] = AUTH_A) -> None:
    r = await client.post("/v1/conversations", json={"conversation_id": cid}, headers=auth)
    assert r.status_code == 201, r.text


def _assert_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str)
    assert isinstance(body["error"]["retryable"], bool)


# --- auth and tenancy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": KEY_A}, {"Authorization": "Basic x"}],
)
async def test_missing_or_unknown_key_is_401(nodes: Nodes, headers: dict[str, str]) -> None:
    r = await nodes.east.get("/v1/conversations/x", headers=headers)
    _assert_error(r, 401, "unauthorized")


async def test_create_and_read_conversation(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    r = await nodes.east.post(
        "/v1/conversations", json={"conversation_id": cid, "metadata": {"k": 1}}, headers=AUTH_A
    )
    assert r.status_code == 201
    created = r.json()
    assert created["conversation_id"] == cid
    assert created["leader_region"] == created["home_region"] == "east"
    assert created["model_revision"] == "m-1"
    assert created["created_at"] == "2026-01-01T00:00:00.000Z"
    assert r.headers["x-convplane-served-by"] == "east"
    got = (await nodes.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)).json()
    assert got == {
        "conversation_id": cid,
        "last_seq": 0,
        "leader_region": "east",
        "home_region": "east",  # deprecated alias
        "epoch": 1,
        "model_revision": "m-1",
        "metadata": {"k": 1},
        "created_at": "2026-01-01T00:00:00.000Z",
    }


async def test_create_without_body_generates_an_id(nodes: Nodes) -> None:
    for _ in range(5):  # the generated id may land on either region: both must work
        r = await nodes.east.post("/v1/conversations", headers=AUTH_A)
        assert r.status_code == 201, r.text
        assert r.json()["conversation_id"].startswith("c-")


async def test_other_tenants_conversation_is_404(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    r = await nodes.east.get(f"/v1/conversations/{cid}", headers=AUTH_B)
    _assert_error(r, 404, "not_found")
    r = await nodes.east.post(
        f"/v1/conversations/{cid}/events", json={"type": "note"}, headers=AUTH_B
    )
    _assert_error(r, 404, "not_found")


async def test_quota_exceeded_is_429_with_retry_after(nodes: Nodes) -> None:
    statuses = [
        (await nodes.east.get("/v1/conversations/q", headers=AUTH_B)).status_code for _ in range(6)
    ]
    assert statuses[:3] == [404, 404, 404]  # burst 3 at 1/s
    assert 429 in statuses[3:]
    r = await nodes.east.get("/v1/conversations/q", headers=AUTH_B)
    _assert_error(r, 429, "quota_exceeded")
    assert int(r.headers["retry-after"]) >= 1


# --- appends ------------------------------------------------------------------------------------


async def test_append_idempotent_retry_returns_the_original(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    headers = {**AUTH_A, "Idempotency-Key": "k-1"}
    body = {"type": "message.user", "payload": {"content": "hi"}, "token_count": 2}
    first = await nodes.east.post(f"/v1/conversations/{cid}/events", json=body, headers=headers)
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    assert first.json()["seq"] == 1
    assert first.json()["acked_by"] == ["east", "other"]
    again = await nodes.east.post(f"/v1/conversations/{cid}/events", json=body, headers=headers)
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    other = {**body, "payload": {"content": "changed"}}
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json=other, headers=headers)
    _assert_error(r, 409, "idempotency_key_reused")


async def test_expected_seq_conflict_is_409(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    url = f"/v1/conversations/{cid}/events"
    ok = await nodes.east.post(url, json={"type": "note", "expected_seq": 0}, headers=AUTH_A)
    assert ok.status_code == 201
    r = await nodes.east.post(url, json={"type": "note", "expected_seq": 0}, headers=AUTH_A)
    _assert_error(r, 409, "seq_conflict")


async def test_events_page_and_tool_attempt(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    url = f"/v1/conversations/{cid}/events"
    for payload in ({"text": "a"}, {"attempt_id": "t1", "tool": "x"}, {"text": "b"}):
        r = await nodes.east.post(url, json={"type": "note", "payload": payload}, headers=AUTH_A)
        assert r.status_code == 201
    effect = {"type": "tool.effect", "payload": {"attempt_id": "t1", "status": "committed"}}
    assert (await nodes.east.post(url, json=effect, headers=AUTH_A)).status_code == 201
    repeat = await nodes.east.post(url, json=effect, headers=AUTH_A)  # the log's first result
    assert (repeat.status_code, repeat.json()["seq"]) == (200, 4), repeat.text
    other = {**effect, "payload": {"attempt_id": "t1", "status": "failed"}}
    _assert_error(await nodes.east.post(url, json=other, headers=AUTH_A), 409, "effect_conflict")
    page = (await nodes.east.get(url, params={"after_seq": 1, "limit": 2}, headers=AUTH_A)).json()
    assert [e["seq"] for e in page["events"]] == [2, 3]
    assert page["next_after_seq"] == 3
    empty = (await nodes.east.get(url, params={"after_seq": 9}, headers=AUTH_A)).json()
    assert empty == {"events": [], "next_after_seq": 9}
    r = await nodes.east.get(f"/v1/conversations/{cid}/tool-attempts/t1", headers=AUTH_A)
    assert r.json()["state"] == "committed"
    assert [e["type"] for e in r.json()["events"]] == ["note", "tool.effect"]


# --- client errors: 400, 413, 415, never a 5xx ---------------------------------------------------


async def test_malformed_json_is_400(nodes: Nodes) -> None:
    headers = {**AUTH_A, "Content-Type": "application/json"}
    for raw in (b"{", b'{"type": NaN}', b"[" * 4000, b"\xff\xfe"):
        r = await nodes.east.post("/v1/conversations", content=raw, headers=headers)
        _assert_error(r, 400, "invalid_request")


async def test_wrong_content_type_is_415(nodes: Nodes) -> None:
    headers = {**AUTH_A, "Content-Type": "text/plain"}
    r = await nodes.east.post("/v1/conversations", content=b"{}", headers=headers)
    _assert_error(r, 415, "unsupported_media_type")


async def test_body_over_limit_is_413(nodes: Nodes) -> None:
    big = {"conversation_id": "c", "metadata": {"x": "y" * 5000}}
    r = await nodes.east.post("/v1/conversations", json=big, headers=AUTH_A)
    _assert_error(r, 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"conversation_id": "c", "metadata": {"x": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}}'

    headers = {**AUTH_A, "Content-Type": "application/json"}
    r = await nodes.east.post("/v1/conversations", content=chunks(), headers=headers)
    _assert_error(r, 413, "payload_too_large")


@pytest.mark.parametrize(
    "body",
    [
        {"type": "bogus"},
        {"type": "note", "expected_seq": -1},
        {"type": "note", "token_count": 2**70},
        {"type": "note", "payload": []},
        {"type": "note", "extra": 1},
        {},
        [],
        "text",
    ],
)
async def test_invalid_append_body_is_400(nodes: Nodes, body: object) -> None:
    cid = conversation_led_by("east")
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json=body, headers=AUTH_A)
    _assert_error(r, 400, "invalid_request")


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/conversations/bad%20id", {}),
        ("/v1/conversations/" + "x" * 129, {}),
        ("/v1/conversations/ok/events?limit=0", {}),
        ("/v1/conversations/ok/events?limit=1001", {}),
        ("/v1/conversations/ok/events?after_seq=-1", {}),
        ("/v1/conversations/ok/events?after_seq=abc", {}),
        ("/v1/conversations/ok", {"X-Convplane-Deadline-Ms": "soon"}),
        ("/v1/conversations/ok", {"X-Convplane-Deadline-Ms": b"\xb2"}),
    ],
)
async def test_invalid_query_path_or_header_is_400(
    nodes: Nodes, path: str, headers: dict[str, str | bytes]
) -> None:
    merged = [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in AUTH_A.items()]
    merged += [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in headers.items()]
    r = await nodes.east.get(path, headers=merged)
    _assert_error(r, 400, "invalid_request")


async def test_bad_idempotency_key_is_400(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    r = await nodes.east.post(
        f"/v1/conversations/{cid}/events",
        json={"type": "note"},
        headers={**AUTH_A, "Idempotency-Key": "k" * 256},
    )
    _assert_error(r, 400, "invalid_request")


async def test_metadata_over_its_limit_is_400(nodes: Nodes) -> None:
    body = {"conversation_id": "m", "metadata": {"x": "y" * 2000}}  # under the body limit
    r = await nodes.east.post("/v1/conversations", json=body, headers=AUTH_A)
    _assert_error(r, 400, "invalid_request")
    assert "metadata" in r.json()["error"]["message"]


async def test_unknown_route_and_method_are_json(nodes: Nodes) -> None:
    r = await nodes.east.get("/v1/nope", headers=AUTH_A)
    _assert_error(r, 404, "not_found")
    r = await nodes.east.delete("/v1/conversations/x", headers=AUTH_A)
    _assert_error(r, 405, "method_not_allowed")


# --- deadlines ----------------------------------------------------------------------------------


async def test_expired_deadline_is_504_without_calling_the_log(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    headers = {**AUTH_A, "X-Convplane-Deadline-Ms": "0"}
    calls = nodes.east_log.calls
    r = await nodes.east.get(f"/v1/conversations/{cid}", headers=headers)
    _assert_error(r, 504, "deadline_exceeded")
    assert nodes.east_log.calls == calls


async def test_append_past_deadline_is_503_outcome_unknown(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    nodes.east_log.stall = True
    headers = {**AUTH_A, "X-Convplane-Deadline-Ms": "20", "Idempotency-Key": "k"}
    r = await nodes.east.post(
        f"/v1/conversations/{cid}/events", json={"type": "note"}, headers=headers
    )
    _assert_error(r, 503, "outcome_unknown")
    assert "Idempotency-Key is safe" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) >= 1
    r = await nodes.east.get(f"/v1/conversations/{cid}", headers=headers)
    _assert_error(r, 504, "deadline_exceeded")


# --- forwarding ---------------------------------------------------------------------------------


async def test_request_for_other_region_is_forwarded(nodes: Nodes) -> None:
    cid = conversation_led_by("west")
    r = await nodes.east.post("/v1/conversations", json={"conversation_id": cid}, headers=AUTH_A)
    assert r.status_code == 201
    assert r.headers["x-convplane-served-by"] == "west"
    assert r.json()["leader_region"] == "west"
    assert ("a", cid) in nodes.west_log.convs and ("a", cid) not in nodes.east_log.convs
    url = f"/v1/conversations/{cid}/events"
    headers = {**AUTH_A, "Idempotency-Key": "k"}
    first = await nodes.east.post(url, json={"type": "note"}, headers=headers)
    again = await nodes.east.post(url, json={"type": "note"}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["x-convplane-served-by"] == "west"
    page = await nodes.east.get(url, params={"limit": 5}, headers=AUTH_A)
    assert [e["seq"] for e in page.json()["events"]] == [1]
    _assert_error(await nodes.east.get(f"/v1/conversations/{cid}"), 401, "unauthorized")


async def test_peer_error_status_is_relayed(nodes: Nodes) -> None:
    cid = conversation_led_by("west")
    r = await nodes.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)
    _assert_error(r, 404, "not_found")
    assert r.headers["x-convplane-served-by"] == "west"


async def test_unreachable_leader_is_503_forward_failed(nodes: Nodes) -> None:
    del nodes.routing.apps["west.test"]
    cid = conversation_led_by("west")
    r = await nodes.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)
    _assert_error(r, 503, "forward_failed")
    assert r.headers["x-convplane-served-by"] == "east"


# --- ops ----------------------------------------------------------------------------------------


async def test_healthz_metrics_and_docs(nodes: Nodes) -> None:
    r = await nodes.east.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "region": "east",
        "shards_placed": 4,
        "shards_led": 4,
        "unhealthy_loops": [],
    }
    cid = conversation_led_by("east")
    await _create(nodes.east, cid)
    await nodes.east.post(f"/v1/conversations/{cid}/events", json={"type": "note"}, headers=AUTH_A)
    text = (await nodes.east.get("/metrics")).text
    assert 'route="/v1/conversations/{conversation_id}/events",status="201"' in text
    assert 'convplane_append_ack_latency_seconds_count{leader_region="east"} 1.0' in text
    assert (await nodes.east.get("/openapi.json")).json()["paths"]
    assert (await nodes.east.get("/docs")).status_code == 200

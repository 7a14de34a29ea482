"""The route's own checks as the fast lane applies them (``services.api.append_check``): what
they accept the route serves, and everything they refuse the route refuses itself, so every
refusal stays the route's own. The app's path here (no listener: the lane never looks)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from services.api.append_check import AppendCheck
from tests.unit.api_fakes import KEY_A, FakeLog, HostRouting, build_app, leaders

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
EVENTS = "/v1/conversations/{}/events"


@pytest.fixture
async def east() -> AsyncIterator[httpx.AsyncClient]:
    """A node (east leads every shard) with a conversation ``c1``, through its app."""
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=HostRouting()))
        app = build_app("east", FakeLog("east", dict.fromkeys(leaders(), "east")), peers)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://east.test")
        )
        r = await client.post("/v1/conversations", json={"conversation_id": "c1"}, headers=AUTH_A)
        assert r.status_code == 201, r.text
        yield client


async def test_what_the_checks_accept_the_route_serves(east: httpx.AsyncClient) -> None:
    client = east
    check = AppendCheck()
    assert check.accepted("c1", [b"k1"], {"type": "note"}) is not None
    assert check.accepted("c1", [], {"type": "note", "expected_seq": 7}) is not None
    headers = {**AUTH_A, "Idempotency-Key": "k1"}
    first = await client.post(EVENTS.format("c1"), json={"type": "note"}, headers=headers)
    again = await client.post(EVENTS.format("c1"), json={"type": "note"}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
    assert again.headers["idempotent-replayed"] == "true"
    assert first.headers["x-convplane-served-by"] == "east"
    conflict = await client.post(
        EVENTS.format("c1"), json={"type": "note", "expected_seq": 7}, headers=AUTH_A
    )
    assert (conflict.status_code, conflict.json()["error"]["code"]) == (409, "seq_conflict")
    metrics = (await client.get("/metrics")).text
    assert (
        'convplane_http_requests_total{method="POST",'
        'route="/v1/conversations/{conversation_id}/events",status="201"} 1.0'
        in metrics
        or 'route="/v1/conversations/{conversation_id}/events",method="POST",status="201"} 1.0'
        in metrics
    )


@pytest.mark.parametrize(
    ("conversation_id", "headers", "body", "status", "code"),
    [
        ("c1", {"Authorization": "Bearer nope"}, {"type": "note"}, 401, "unauthorized"),
        ("c1", AUTH_A, {"type": "message.user"}, 400, "invalid_request"),
        ("c1", AUTH_A, {"type": "note", "extra": 1}, 400, "invalid_request"),
        ("c1", AUTH_A, {"type": "note", "expected_seq": "1"}, 400, "invalid_request"),
        ("c1", {**AUTH_A, "Idempotency-Key": " x"}, {"type": "note"}, 400, "invalid_request"),
        ("c1", {**AUTH_A, "Idempotency-Key": "k" * 256}, {"type": "note"}, 400, "invalid_request"),
        ("c" * 129, AUTH_A, {"type": "note"}, 400, "invalid_request"),
        ("a%20b", AUTH_A, {"type": "note"}, 400, "invalid_request"),
    ],
)
async def test_what_the_checks_refuse_the_route_refuses(
    east: httpx.AsyncClient,
    conversation_id: str,
    headers: dict[str, str],
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    r = await east.post(EVENTS.format(conversation_id), json=body, headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    if status == 400:  # the lane's checks refuse the request too: the route words it
        keys = [v.encode() for k, v in headers.items() if k == "Idempotency-Key"]
        assert AppendCheck().accepted(conversation_id, keys, body) is None


def test_more_than_one_idempotency_key_is_refused() -> None:
    assert AppendCheck().accepted("c1", [b"a", b"b"], {"type": "note"}) is None

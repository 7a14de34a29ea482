"""The append fast path (``services.api.fast_append``) serves valid appends itself and hands
everything else to the FastAPI route, so every refusal stays the route's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from services.api.fast_append import PARSED_BODY_SCOPE_KEY, FastAppend
from services.api.metrics import Metrics
from tests.unit.api_fakes import KEY_A, FakeLog, HostRouting, build_app, leaders

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
EVENTS = "/v1/conversations/{}/events"


@pytest.fixture
async def east() -> AsyncIterator[tuple[httpx.AsyncClient, list[bool]]]:
    """A node (east leads every shard), and what the fast path answered for each request."""
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient(transport=HostRouting()))
        app = build_app("east", FakeLog("east", dict.fromkeys(leaders(), "east")), peers)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://east.test")
        )
        r = await client.post("/v1/conversations", json={"conversation_id": "c1"}, headers=AUTH_A)
        assert r.status_code == 201, r.text
        served: list[bool] = []
        original = FastAppend.__call__

        async def spy(self: FastAppend, scope: Any, receive: Any, send: Any) -> bool:
            answered = await original(self, scope, receive, send)
            served.append(answered)
            return answered

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(FastAppend, "__call__", spy)
            yield client, served


async def test_a_valid_append_is_served_by_the_fast_path(
    east: tuple[httpx.AsyncClient, list[bool]],
) -> None:
    client, served = east
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
    assert served == [True, True, True]
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
async def test_what_the_fast_path_refuses_the_route_answers(
    east: tuple[httpx.AsyncClient, list[bool]],
    conversation_id: str,
    headers: dict[str, str],
    body: dict[str, Any],
    status: int,
    code: str,
) -> None:
    client, served = east
    r = await client.post(EVENTS.format(conversation_id), json=body, headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert True not in served  # admission itself answers a bad key, before the fast path


async def test_a_request_without_a_parsed_body_is_not_taken() -> None:
    sent: list[object] = []

    async def send(message: object) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("the fast path must not read the body")

    scope: dict[str, Any] = {"type": "http", "method": "POST",
                             "path": "/v1/conversations/c1/events", "headers": []}  # fmt: skip
    assert not await FastAppend(1.0, Metrics("east").count_error)(scope, receive, send)
    scope = {**scope, "method": "GET", PARSED_BODY_SCOPE_KEY: {"type": "note"}}
    assert not await FastAppend(1.0, Metrics("east").count_error)(scope, receive, send)
    assert sent == []

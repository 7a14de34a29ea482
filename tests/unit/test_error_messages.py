"""Error messages say the whole of what the client must change: an unknown event type's message
names every accepted type (it was cut off mid-list), and echoes the client's value only briefly."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from eventlog.model import EVENT_TYPES
from tests.unit.api_fakes import KEY_A, lone_node_client

AUTH = {"Authorization": f"Bearer {KEY_A}"}


@pytest.fixture
async def east() -> AsyncIterator[httpx.AsyncClient]:
    async with lone_node_client() as client:
        yield client


async def _append(east: httpx.AsyncClient, body: object) -> dict[str, object]:
    r = await east.post("/v1/conversations", json={}, headers=AUTH)
    conversation_id = r.json()["conversation_id"]
    r = await east.post(f"/v1/conversations/{conversation_id}/events", json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    error: dict[str, object] = r.json()["error"]
    assert error["code"] == "invalid_request" and error["retryable"] is False
    return error


async def test_an_unknown_event_type_names_every_accepted_type(east: httpx.AsyncClient) -> None:
    error = await _append(east, {"type": "message.robot", "payload": {}})
    message = str(error["message"])
    assert "'message.robot'" in message
    for event_type in EVENT_TYPES:
        assert f"'{event_type}'" in message, (event_type, message)


async def test_a_long_unknown_type_is_echoed_only_in_part(east: httpx.AsyncClient) -> None:
    error = await _append(east, {"type": "x" * 5000, "payload": {}})
    message = str(error["message"])
    assert "x" * 64 in message and "x" * 65 not in message
    assert "'note'" in message


async def test_a_missing_type_says_so(east: httpx.AsyncClient) -> None:
    error = await _append(east, {"payload": {}})
    assert error["message"] == "body: missing 'type'"

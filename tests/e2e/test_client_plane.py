"""The Python client against a real 3-region plane (``convplane up``, SQLite replicas): a
conversation with a tool call, through the blocking and the asyncio client, each also given a
region that does not answer (listed first, so every call meets it until it is passed over)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from convplane_client import AsyncClient, Client, ClientConfig, SeqConflict
from tests.e2e.plane import Plane, start_plane, stop_plane

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
}
TRANSCRIPT_TYPES = [
    "prompt.settings", "message.system", "message.user", "message.assistant", "tool.attempt",
    "tool.effect", "message.tool", "message.assistant",
]  # fmt: skip


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(tmp_path_factory.mktemp("plane"))
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output


def closed_url() -> str:
    """The url of a port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def regions_with_a_dead_one(plane: Plane) -> dict[str, str]:
    return {"gone": closed_url(), **plane.urls}


CONFIG = ClientConfig(deadline_s=60.0, request_timeout_s=20.0)


def test_a_tool_conversation_through_the_blocking_client(plane: Plane) -> None:
    cid = plane.conversation_led_by("eu-west", "client-sync")
    runs: list[str] = []

    def get_weather(attempt_id: str) -> str:
        runs.append(attempt_id)
        return "21 °C, sunny"

    with Client(regions_with_a_dead_one(plane), plane.info["api_key"], config=CONFIG) as client:
        created = client.create_conversation(cid, metadata={"channel": "web"})
        assert created.leader_region == "eu-west" == client.routed_region(cid)
        client.append(cid, "prompt.settings", {"tools": [WEATHER_TOOL]})
        client.append(cid, "message.system", {"content": "You are a travel agent."})
        user = client.append(cid, "message.user", {"content": "Weather in Lisbon?"})
        assert user.served_by == "eu-west" and len(user.acked_by) >= 2
        client.append(cid, "message.assistant", {"content": None, "tool_calls": [TOOL_CALL]})
        run = client.run_tool_once(cid, "call_1", "get_weather", {"city": "Lisbon"}, get_weather)
        again = client.run_tool_once(cid, "call_1", "get_weather", {"city": "Lisbon"}, get_weather)
        client.append(cid, "message.tool", {"tool_call_id": "call_1", "content": run.result})
        last = client.append(cid, "message.assistant", {"content": "It is 21 °C and sunny."})
        replayed = client.append(
            cid, "message.assistant", {"content": "It is 21 °C and sunny."},
            idempotency_key=last.idempotency_key,
        )  # fmt: skip
        with pytest.raises(SeqConflict):
            client.append(cid, "note", {"text": "late"}, expected_seq=1)
        transcript = client.transcript(cid)
        attempt = client.tool_attempt(cid, "call_1")
        route = client.route(cid)
        conversation = client.get_conversation(cid)
    assert runs == ["call_1"]
    assert (run.state, run.ran, again.ran, again.result) == ("committed", True, False, run.result)
    assert (replayed.replayed, replayed.seq, replayed.event_id) == (True, last.seq, last.event_id)
    assert [e.type for e in transcript] == TRANSCRIPT_TYPES
    assert [e.seq for e in transcript] == list(range(1, 9)) and conversation.last_seq == 8
    assert attempt.state == "committed" and attempt.effect() is not None
    assert route.region == "eu-west" and route.model_revision == created.model_revision
    assert conversation.metadata == {"channel": "web"}


async def test_a_tool_conversation_through_the_asyncio_client(plane: Plane) -> None:
    cid = plane.conversation_led_by("ap-south", "client-async")
    runs: list[str] = []

    async def get_weather(attempt_id: str) -> dict[str, str]:
        runs.append(attempt_id)
        return {"forecast": "21 °C, sunny"}

    regions = regions_with_a_dead_one(plane)
    async with AsyncClient(regions, plane.info["api_key"], config=CONFIG) as client:
        created = await client.create_conversation(cid)
        await client.append(cid, "message.user", {"content": "Weather in Lisbon?"})
        await client.append(cid, "message.assistant", {"content": None, "tool_calls": [TOOL_CALL]})
        run = await client.run_tool_once(
            cid, "call_1", "get_weather", {"city": "Lisbon"}, get_weather
        )
        again = await client.run_tool_once(
            cid, "call_1", "get_weather", {"city": "Lisbon"}, get_weather
        )
        await client.append(cid, "message.tool", {"tool_call_id": "call_1", "content": "21 °C"})
        transcript = await client.transcript(cid)
        route = await client.route(cid)
    assert created.leader_region == "ap-south" == route.region
    assert runs == ["call_1"] and run.result == again.result == {"forecast": "21 °C, sunny"}
    assert (run.ran, again.ran) == (True, False)
    assert [e.type for e in transcript] == [
        "message.user", "message.assistant", "tool.attempt", "tool.effect", "message.tool",
    ]  # fmt: skip
    effect = transcript[3].payload
    assert effect == {"attempt_id": "call_1", "status": "committed", "result": run.result}


def test_a_client_from_the_cluster_file_of_a_local_plane(plane: Plane) -> None:
    """What ``convplane demo`` needs: a client from the ``cluster.json`` that ``up`` wrote."""
    cluster_json = Path(plane.info["cluster_file"]).parent / "cluster.json"
    with Client.from_cluster_file(cluster_json, config=CONFIG) as client:
        created = client.create_conversation()
        appended = client.append(created.conversation_id, "message.user", {"content": "hi"})
        route = client.route(created.conversation_id)
    assert dict(client.regions) == plane.urls
    assert appended.seq == 1 and route.region == created.leader_region

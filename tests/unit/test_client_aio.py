"""The asyncio client drives the same plans as the blocking one (``test_client``): here, that
its driver sends, sleeps on the injected clock, maps transport errors and awaits async tools."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from convplane_client import (
    IDEMPOTENCY_KEY_HEADER,
    AsyncClient,
    ClientConfig,
    NotFound,
    TransportFailed,
)
from tests.unit.test_client_fake_plane import FakePlane, VirtualClock, error


def async_client(plane: FakePlane, clock: VirtualClock, **config: Any) -> AsyncClient:
    return AsyncClient(
        plane.urls,
        "key",
        config=ClientConfig(**config),
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(plane.handle)),
        clock=clock,
        rng=random.Random(7),
    )


async def test_async_retries_with_the_same_key_and_waits_on_the_clock() -> None:
    plane, clock = FakePlane(), VirtualClock()
    async with async_client(plane, clock) as client:
        await client.create_conversation("c1")
        plane.faults.append(plane.lose_answer())
        plane.faults.append(lambda r, region: error(503, "no_quorum", True, **{"Retry-After": "2"}))
        appended = await client.append("c1", "note", {"n": 1})
        events = await client.transcript("c1")
    keys = {
        r.headers[IDEMPOTENCY_KEY_HEADER]
        for _, r in plane.sent
        if r.url.path.endswith("/events") and r.method == "POST"
    }
    assert appended.replayed and len(keys) == 1 and [e.seq for e in events] == [1]
    assert clock.sleeps == [2.0]


async def test_async_falls_back_and_raises_typed_errors() -> None:
    plane, clock = FakePlane(down={"us-east"}), VirtualClock()
    async with async_client(plane, clock, attempts_max=2) as client:
        created = await client.create_conversation("c1")
        with pytest.raises(NotFound):
            await client.tool_attempt("c1", "never")
        plane.down = {"us-east", "eu-west", "ap-south"}
        with pytest.raises(TransportFailed):
            await client.get_conversation("c1")
    assert created.leader_region == "us-east"
    assert [region for region, _ in plane.sent][:2] == ["us-east", "eu-west"]


async def test_async_run_tool_once_awaits_a_coroutine_tool_once() -> None:
    plane, runs = FakePlane(), []

    async def lookup(key: str) -> str:
        runs.append(key)
        return "21 °C"

    async with async_client(plane, VirtualClock()) as client:
        await client.create_conversation("c1")
        first = await client.run_tool_once("c1", "call_1", "weather", {"city": "Lisbon"}, lookup)
        second = await client.run_tool_once("c1", "call_1", "weather", {"city": "Lisbon"}, lookup)
    assert runs == ["call_1"]
    assert (first.result, first.ran, second.result, second.ran) == ("21 °C", True, "21 °C", False)

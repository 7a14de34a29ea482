"""Hostile clients at one node's edge, over the fake log on virtual time: slow bodies hold no
admission permit, queue time is taken from the deadline, method tokens cannot mint metric
series. (The same attacks over real sockets: ``tests/e2e/test_hostile_clients.py``.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.api.forwarding import escaped_path
from tests.unit.admission_nodes import (
    AUTH_A,
    SlowLog,
    assert_error,
    build_node,
    cluster,
    create_conversation,
    node_clock,
    two_nodes,
    until,
    until_metric,
)
from tests.unit.api_fakes import HostRouting, conversation_led_by

DEADLINE = "X-Convplane-Deadline-Ms"


def _slow_body(release: asyncio.Event, sent: list[int]) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"metadata": {'
        sent.append(1)
        await release.wait()
        yield b"}}"

    return chunks()


async def test_slow_bodies_hold_no_permit_while_they_arrive() -> None:
    async with two_nodes(
        admission_limit_initial=1, admission_limit_min=1, admission_queue_max=0
    ) as n:
        release, sent = asyncio.Event(), list[Any]()
        slow = [
            asyncio.create_task(
                n.east.post(
                    "/v1/conversations",
                    content=_slow_body(release, sent),
                    headers={**AUTH_A, "Content-Type": "application/json"},
                )
            )
            for _ in range(3)
        ]
        await until(lambda: len(sent) == 3)  # every slow body is half sent
        r = await n.east.post(
            "/v1/conversations", json={"conversation_id": "quick"}, headers=AUTH_A
        )
        assert r.status_code == 201, r.text  # the only permit was free
        release.set()  # now they compete for the one permit, with no queue
        statuses = sorted([(await s).status_code for s in slow])
        assert statuses[0] == 201 and set(statuses) <= {201, 503}


async def test_a_body_that_does_not_arrive_in_time_is_408_and_never_admitted() -> None:
    async with two_nodes(body_read_timeout_s=0.05) as n:
        never, sent = asyncio.Event(), list[Any]()
        r = await n.east.post(
            "/v1/conversations",
            content=_slow_body(never, sent),
            headers={**AUTH_A, "Content-Type": "application/json"},
        )
        assert_error(r, 408, "request_timeout")
        assert r.headers["connection"] == "close"
        assert n.east_log.entered == 0


async def test_a_deadline_shorter_than_the_body_timeout_is_504() -> None:
    async with two_nodes(body_read_timeout_s=60.0) as n:
        never, sent = asyncio.Event(), list[Any]()
        r = await n.east.post(
            "/v1/conversations",
            content=_slow_body(never, sent),
            headers={**AUTH_A, "Content-Type": "application/json", DEADLINE: "50"},
        )
        assert_error(r, 504, "deadline_exceeded")


async def test_time_queued_in_admission_is_taken_from_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forwarded_budgets_ms: list[int] = []
    route = HostRouting.handle_async_request

    async def recording(self: HostRouting, request: httpx.Request) -> httpx.Response:
        forwarded_budgets_ms.append(int(request.headers[DEADLINE]))
        return await route(self, request)

    monkeypatch.setattr(HostRouting, "handle_async_request", recording)
    async with two_nodes(admission_limit_initial=1, admission_limit_min=1) as n:
        east_cid, west_cid = conversation_led_by("east"), conversation_led_by("west")
        await create_conversation(n.east, east_cid)
        await create_conversation(n.west, west_cid)
        n.east_log.gate.clear()
        holder = asyncio.create_task(n.east.get(f"/v1/conversations/{east_cid}", headers=AUTH_A))
        await until(lambda: n.east_log.entered == 2)  # the create, then this read
        queued = asyncio.create_task(
            n.east.get(f"/v1/conversations/{west_cid}", headers={**AUTH_A, DEADLINE: "1000"})
        )
        await until_metric(n.east, "convplane_admission_queue_length", 1)
        n.clock.now_s += 0.6  # 600 ms of its 1000 spent waiting for a permit
        n.east_log.gate.set()
        assert (await holder).status_code == 200
        r = await queued
        assert r.status_code == 200, r.text
        assert r.headers["x-convplane-served-by"] == "west"
    assert 0 < forwarded_budgets_ms[-1] <= 400


async def test_unknown_method_tokens_share_one_metric_label() -> None:
    async with two_nodes() as n:
        for i in range(5):
            r = await n.east.request(f"X{i}FOO", "/v1/conversations", headers=AUTH_A)
            assert r.status_code in (404, 405), r.text
            assert "error" in json.loads(r.text)
        text = (await n.east.get("/metrics")).text
    assert "FOO" not in text
    assert 'method="other"' in text


@pytest.mark.parametrize("dots", [".", ".."])
async def test_dot_ids_are_refused_in_bodies_and_paths(dots: str) -> None:
    async with two_nodes() as n:
        created = await n.east.post(
            "/v1/conversations", json={"conversation_id": dots}, headers=AUTH_A
        )
        assert_error(created, 400, "invalid_request")
        encoded = "%2E" * len(dots)  # as a client would have to send it to get past its URL lib
        read = await n.east.get(f"/v1/conversations/{encoded}/events", headers=AUTH_A)
        assert_error(read, 400, "invalid_request")
        assert n.east_log.entered == 0


@pytest.mark.parametrize("dotted", ["...", ".a", "..b", "a.."])
async def test_ids_with_dots_that_are_not_path_segments_work(dotted: str) -> None:
    async with two_nodes() as n:
        cid = conversation_led_by("west", prefix=dotted)  # forwarded: east -> west
        created = await n.east.post(
            "/v1/conversations", json={"conversation_id": cid}, headers=AUTH_A
        )
        assert created.status_code == 201, created.text
        read = await n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)
        assert read.status_code == 200 and read.headers["x-convplane-served-by"] == "west"


def test_forwarded_paths_escape_every_segment() -> None:
    assert escaped_path("/v1/conversations/a:b.c/events") == "/v1/conversations/a%3Ab.c/events"
    assert (
        escaped_path("/v1/conversations/x?y#z%/events") == "/v1/conversations/x%3Fy%23z%25/events"
    )


async def test_an_events_page_is_bounded_in_bytes_and_reading_on_gets_everything() -> None:
    event_payload_bytes = 200 * 1024
    async with two_nodes(events_page_bytes_max=1024 * 1024) as n:
        cid = conversation_led_by("east")
        await create_conversation(n.east, cid)
        for i in range(10):
            body = {"type": "note", "payload": {"blob": str(i) * event_payload_bytes}}
            r = await n.east.post(f"/v1/conversations/{cid}/events", json=body, headers=AUTH_A)
            assert r.status_code == 201, r.text
        seqs, after_seq, pages = [], 0, 0
        while True:
            r = await n.east.get(
                f"/v1/conversations/{cid}/events",
                params={"after_seq": after_seq, "limit": 1000},
                headers=AUTH_A,
            )
            assert r.status_code == 200, r.text
            assert len(r.content) <= 1024 * 1024 + 4096  # the page's bytes, plus its envelope
            page = r.json()
            if not page["events"]:
                break
            pages += 1
            seqs += [e["seq"] for e in page["events"]]
            after_seq = page["next_after_seq"]
        assert pages >= 2
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == 10


async def test_a_client_that_does_not_read_its_response_gives_its_permit_back() -> None:
    clock = node_clock()
    log = SlowLog("east", clock)
    async with httpx.AsyncClient(transport=HostRouting()) as peers:
        app = build_node(
            "east", log, peers, clock, cluster(), send_timeout_s=0.05,
            admission_limit_initial=1, admission_limit_min=1, admission_queue_max=0,
        )  # fmt: skip
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://east.test") as c:
                cid = conversation_led_by("east")
                await create_conversation(c, cid)

                async def never_reads(message: Any) -> None:
                    if message["type"] == "http.response.body":
                        await asyncio.Event().wait()

                async def request() -> Any:
                    return {"type": "http.request", "body": b"", "more_body": False}

                path = f"/v1/conversations/{cid}"
                scope = {
                    "type": "http", "http_version": "1.1", "method": "GET", "scheme": "http",
                    "path": path, "raw_path": path.encode(), "query_string": b"",
                    "root_path": "", "server": ("east.test", 80), "client": ("127.0.0.1", 1),
                    "headers": [(b"host", b"east.test"), (b"authorization", AUTH_A["Authorization"].encode())],
                }  # fmt: skip
                stuck = asyncio.create_task(app(scope, request, never_reads))
                for _ in range(500):  # bounded: the test fails, never hangs, on a held permit
                    if stuck.done():
                        break
                    await asyncio.sleep(0.01)
                stuck.cancel()
                r = await c.get(path, headers=AUTH_A)  # the one permit is free again
                assert r.status_code == 200, r.text

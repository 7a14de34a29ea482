"""Admission in the region node, over a fake log on virtual time.

The log's latency is virtual: each call advances a manual clock (the node's clock) by
``latency_s``; a closed ``gate`` holds calls until the test opens it. Nothing here asserts how
long anything took in real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventlog.errors import Overloaded
from services.api.admission import NodeAdmission
from services.api.auth import Tenants
from services.api.metrics import Metrics
from services.config import NodeSettings
from tests.unit.admission_nodes import (
    AUTH_A,
    SECRET,
    Nodes,
    assert_error,
    cluster,
    create_conversation,
    metric_value,
    node_clock,
    two_nodes,
    until,
    until_metric,
)
from tests.unit.api_fakes import (
    KEY_A,
    KEY_B,
    conversation_led_by,
)

AUTH_B = {"Authorization": f"Bearer {KEY_B}"}  # tenant b: 1 request/s, burst 3
PEER = {"X-Convplane-Forwarded": "1", "X-Convplane-Peer-Auth": SECRET}
FROM_EAST = {"X-Convplane-Source-Region": "east"}


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    async with two_nodes() as n:
        yield n


# --- overload ----------------------------------------------------------------------------------


async def test_rising_log_latency_sheds_with_503_instead_of_queueing() -> None:
    queue_max = 4
    async with two_nodes(
        admission_limit_initial=16, admission_limit_min=2, admission_queue_max=queue_max
    ) as n:
        cid = conversation_led_by("east")
        await create_conversation(n.east, cid)
        for _ in range(20):  # fast log: 1 ms
            assert (await n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)).status_code == 200
        limit_fast = await metric_value(n.east, "convplane_admission_limit")
        n.east_log.latency_s = 0.05  # the log slows down 50x
        for _ in range(40):
            assert (await n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A)).status_code == 200
        limit_slow = int(await metric_value(n.east, "convplane_admission_limit"))
        assert limit_slow < limit_fast

        n.east_log.gate.clear()  # now a burst arrives while the slow log holds every call
        entered, burst = n.east_log.entered, 30
        tasks = [
            asyncio.create_task(n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A))
            for _ in range(burst)
        ]
        shed = burst - limit_slow - queue_max
        await until(lambda: sum(t.done() for t in tasks) == shed)
        assert n.east_log.entered - entered == limit_slow  # only the admitted reached the log
        assert await metric_value(n.east, "convplane_admission_in_flight") == limit_slow
        assert await metric_value(n.east, "convplane_admission_queue_length") == queue_max
        for task in [t for t in tasks if t.done()]:
            assert_error(task.result(), 503, "overloaded")
        n.east_log.gate.set()
        served = [r.status_code for r in await asyncio.gather(*tasks)].count(200)
        assert served == limit_slow + queue_max
        assert n.east_log.entered - entered == served
        text = (await n.east.get("/metrics")).text
        assert f'convplane_admission_rejections_total{{reason="overloaded"}} {shed}.0' in text


async def test_request_queued_past_its_deadline_gets_503_and_never_reaches_the_log() -> None:
    async with two_nodes(admission_limit_initial=1, admission_limit_min=1) as n:
        cid = conversation_led_by("east")
        await create_conversation(n.east, cid)
        n.east_log.gate.clear()
        url = f"/v1/conversations/{cid}"
        first = asyncio.create_task(n.east.get(url, headers=AUTH_A))
        await until(lambda: n.east_log.entered == 2)  # the create, then this read
        late = asyncio.create_task(
            n.east.get(url, headers={**AUTH_A, "X-Convplane-Deadline-Ms": "50"})
        )
        await until_metric(n.east, "convplane_admission_queue_length", 1)
        assert not late.done()
        n.clock.now_s += 1.0  # its deadline passes while it waits
        assert_error(await late, 503, "overloaded")
        n.east_log.gate.set()
        assert (await first).status_code == 200
        assert n.east_log.entered == 2


@pytest.mark.parametrize("deadline_ms", ["0", "-5"])
async def test_expired_deadline_is_504_before_any_work(nodes: Nodes, deadline_ms: str) -> None:
    cid = conversation_led_by("east")
    headers = {**AUTH_A, "X-Convplane-Deadline-Ms": deadline_ms}
    r = await nodes.east.post(f"/v1/conversations/{cid}/events", json={"t": 1}, headers=headers)
    assert_error(r, 504, "deadline_exceeded")
    assert nodes.east_log.calls == 0
    text = (await nodes.east.get("/metrics")).text
    assert 'convplane_admission_rejections_total{reason="deadline_exceeded"} 1.0' in text


async def test_health_and_metrics_answer_while_the_api_sheds() -> None:
    async with two_nodes(
        admission_limit_initial=1, admission_limit_min=1, admission_queue_max=0
    ) as n:
        cid = conversation_led_by("east")
        await create_conversation(n.east, cid)
        n.east_log.gate.clear()
        held = asyncio.create_task(n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A))
        await until(lambda: n.east_log.entered == 2)
        assert_error(
            await n.east.get(f"/v1/conversations/{cid}", headers=AUTH_A), 503, "overloaded"
        )
        assert (await n.east.get("/healthz")).status_code == 200
        assert await metric_value(n.east, "convplane_admission_in_flight") == 1
        n.east_log.gate.set()
        assert (await held).status_code == 200


# --- quotas ------------------------------------------------------------------------------------


async def test_tenant_over_quota_gets_429_while_another_is_served(nodes: Nodes) -> None:
    cid = conversation_led_by("east")
    await create_conversation(nodes.east, cid)
    url = f"/v1/conversations/{cid}"
    statuses_b = [(await nodes.east.get(url, headers=AUTH_B)).status_code for _ in range(3)]
    assert statuses_b == [404, 404, 404]  # served (it is tenant a's conversation)
    calls = nodes.east_log.calls
    for _ in range(10):
        r = await nodes.east.get(url, headers=AUTH_B)
        assert_error(r, 429, "quota_exceeded")
        assert (await nodes.east.get(url, headers=AUTH_A)).status_code == 200
    assert nodes.east_log.calls == calls + 10  # only tenant a's requests did work
    nodes.clock.now_s += 1.0  # one token back at 1/s
    assert (await nodes.east.get(url, headers=AUTH_B)).status_code == 404
    assert_error(await nodes.east.get(url, headers=AUTH_B), 429, "quota_exceeded")


async def test_forward_is_charged_once_at_the_entry_node(nodes: Nodes) -> None:
    url = f"/v1/conversations/{conversation_led_by('west')}"
    for _ in range(3):
        r = await nodes.east.get(url, headers=AUTH_B)
        assert (r.status_code, r.headers["x-convplane-served-by"]) == (404, "west")
    r = await nodes.east.get(url, headers=AUTH_B)
    assert_error(r, 429, "quota_exceeded")
    assert r.headers["x-convplane-served-by"] == "east"
    # west never charged b: its own bucket for b is still full
    assert [(await nodes.west.get(url, headers=AUTH_B)).status_code for _ in range(4)] == [
        404, 404, 404, 429,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "spoofed",
    [
        {"X-Convplane-Forwarded": "1"},
        {"X-Convplane-Forwarded": "1", "X-Convplane-Peer-Auth": "x" * 40},
        {"X-Convplane-Forwarded": "1", "X-Convplane-Peer-Auth": SECRET[:-1]},
    ],
)
async def test_forwarded_header_without_the_peer_secret_is_a_client_request(
    nodes: Nodes, spoofed: dict[str, str]
) -> None:
    url = f"/v1/conversations/{conversation_led_by('west')}"
    statuses = [
        (await nodes.west.get(url, headers={**AUTH_B, **spoofed})).status_code for _ in range(4)
    ]
    assert statuses == [404, 404, 404, 429]  # charged like anyone else
    assert await metric_value(nodes.west, "convplane_peer_auth_failures_total") == 4
    # and, being a client request, it may be forwarded (one hop) like one
    r = await nodes.east.get(url, headers={**AUTH_A, **spoofed})
    assert (r.status_code, r.headers["x-convplane-served-by"]) == (404, "west")


async def test_the_peer_secret_on_the_client_side_grants_nothing(nodes: Nodes) -> None:
    """Finding 5 of issue 39: the secret alone, sent where clients send, was full peer trust
    (no quota, no second hop)."""
    url = f"/v1/conversations/{conversation_led_by('west')}"
    statuses = [
        (await nodes.west.get(url, headers={**AUTH_B, **PEER, **FROM_EAST})).status_code
        for _ in range(6)
    ]
    assert statuses == [404, 404, 404, 429, 429, 429]  # charged like anyone else
    assert await metric_value(nodes.west, "convplane_peer_auth_failures_total") == 6


async def test_a_forward_through_the_peer_listener_is_not_charged_nor_forwarded_again(
    nodes: Nodes,
) -> None:
    url = f"/v1/conversations/{conversation_led_by('west')}"
    headers = {**AUTH_B, **PEER, **FROM_EAST}
    statuses = [
        (await nodes.peers.get("http://west.test" + url, headers=headers)).status_code
        for _ in range(6)
    ]
    assert statuses == [404] * 6
    r = await nodes.peers.get("http://east.test" + url, headers=headers)  # east does not lead
    assert_error(r, 503, "forward_failed")
    assert await metric_value(nodes.west, "convplane_peer_auth_failures_total") == 0


async def test_without_a_peer_secret_every_hop_charges() -> None:
    async with two_nodes(peer_secret=None) as n:
        url = f"/v1/conversations/{conversation_led_by('west')}"
        for _ in range(3):
            assert (await n.east.get(url, headers=AUTH_B)).status_code == 404
        # west charged b for each of those forwards: its bucket is empty too
        assert_error(await n.west.get(url, headers=AUTH_B), 429, "quota_exceeded")


# --- the gate directly ----------------------------------------------------------------------------


async def test_peer_endpoints_have_their_own_small_bound() -> None:
    clock = node_clock()
    gate = NodeAdmission(Metrics("us-east"))
    settings = NodeSettings(region="east", cluster=cluster(), peer_in_flight_max=2)
    gate.open(settings=settings, cluster=cluster(), tenants=Tenants([], clock), clock=clock)
    try:
        scope: dict[str, Any] = {"path": "/peer/placement", "headers": []}
        held = [await gate.enter(scope), await gate.enter(scope)]
        with pytest.raises(Overloaded):
            await gate.enter(scope)
        # the probe takes no slot: a region's health answer never waits for one
        assert await gate.enter({"path": "/peer/health", "headers": []}) is None
        gate.exit(held.pop(), 200)
        held.append(await gate.enter(scope))
        assert await gate.enter({"path": "/healthz", "headers": []}) is None
        for entry in held:
            gate.exit(entry, 200)
    finally:
        await gate.close()


async def test_latency_sample_starts_at_admission_not_at_arrival() -> None:
    clock = node_clock()
    config = cluster()
    settings = NodeSettings(
        region="east", cluster=config, admission_limit_initial=1, admission_limit_min=1
    )
    gate = NodeAdmission(Metrics("us-east"))
    gate.open(
        settings=settings, cluster=config, tenants=Tenants(config.tenants, clock), clock=clock
    )
    try:
        scope = {"path": "/v1/x", "headers": [(b"authorization", f"Bearer {KEY_A}".encode())]}
        first = await gate.enter(dict(scope))
        waiting = asyncio.create_task(gate.enter(dict(scope)))
        await until(lambda: gate._queued() == 1)
        clock.now_s += 5.0  # the second waits 5 s in the queue
        gate.exit(first, 200)
        second = await waiting
        assert second is not None and second.admitted_s == clock.now_s
        clock.now_s += 0.01
        gate.exit(second, 200)
        assert gate._open is not None
        assert gate._open.controller.limit.baseline_s == pytest.approx(0.01)
    finally:
        await gate.close()

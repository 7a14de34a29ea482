"""Forwards to a region the failure detector cannot reach fail fast, and an in-flight forward
is abandoned when its target stops answering probes (a black-holed link never errors)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx
import pytest
from starlette.requests import Request

from eventlog.clock import LoopClock
from services.api.errors import ForwardFailed, OutcomeUnknown
from services.api.forward_batch import BatchConfig
from services.api.forwarding import Forwarder
from services.api.metrics import Metrics
from services.control.region_nodes import PeerUrlOf, fixed_peer_urls

WEST = fixed_peer_urls({"west": "http://west.test"})


def make_request(method: str = "POST") -> Request:
    scope = {
        "type": "http",
        "method": method,
        "path": "/v1/conversations/c1/events",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    return Request(scope, receive)


def forwarder(
    client: httpx.AsyncClient,
    reachable: dict[str, bool],
    peer_url: PeerUrlOf = WEST,
    refused: Callable[[str, str], None] = lambda region, url: None,
    node_lost: Callable[[str, str], bool] = lambda region, url: False,
) -> Forwarder:
    return Forwarder(
        client=client,
        peer_url=peer_url,
        source_region="us-east",
        clock=LoopClock(),
        rng=random.Random(1),
        metrics=Metrics("us-east"),
        retries_max=1,
        backoff_s=0.01,
        peer_reachable=lambda region: reachable[region],
        refused=refused,
        node_lost=node_lost,
    )


@pytest.mark.parametrize("silent", ["region", "node"])
async def test_forward_to_a_suspected_region_fails_without_sending(silent: str) -> None:
    """The region is suspected, or the node its view names (no sibling answers either) has
    been silent for the detection time: 503 at once, nothing sent."""
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    transport = httpx.MockTransport(record)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(ForwardFailed, match="not answering"):
            await forwarder(
                client,
                {"west": silent == "node"},
                node_lost=lambda region, url: silent == "node" and url == "http://west.test",
            ).forward(
                make_request(),
                target_region="west",
                deadline_s=LoopClock().monotonic() + 30,
                is_write=True,
            )
    assert sent == []


@pytest.mark.parametrize("silent", ["region", "node"])
async def test_in_flight_forward_is_abandoned_when_its_target_goes_silent(silent: str) -> None:
    """The failure detector comes to suspect the target's region, or (its other node still
    answering) the node the forward is in flight to has been silent for the detection time
    (``RegionNodes.lost``: its host died or drops packets): given up, not waited out until the
    caller's deadline."""
    reachable = {"west": True}
    lost: set[str] = set()
    arrived = asyncio.Event()

    async def black_hole(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await asyncio.sleep(3600)  # the partition swallows the request
        raise AssertionError("unreachable")

    async with httpx.AsyncClient(transport=httpx.MockTransport(black_hole)) as client:
        call = asyncio.ensure_future(
            forwarder(client, reachable, node_lost=lambda region, url: url in lost).forward(
                make_request(),
                target_region="west",
                deadline_s=LoopClock().monotonic() + 3600,
                is_write=True,
            )
        )
        await arrived.wait()
        assert not call.done()
        if silent == "region":
            reachable["west"] = False  # the failure detector now suspects west
        else:
            lost.add("http://west.test")
        with pytest.raises(OutcomeUnknown):
            await call


async def test_a_batch_whose_target_stops_answering_probes_is_outcome_unknown() -> None:
    """Forwarded appends in a batch (``services.api.forward_batch``) are abandoned like a
    single forward when their target stops answering probes, and are not a 500."""
    arrived = asyncio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    reachable = {"west": True}
    limits = BatchConfig(batch_max=8, batches_in_flight_max=1, straggler_s=0.05,
                         batches_open_max=4, queue_max=8, retries_max=1, backoff_s=0.01)  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as client:
        batched = Forwarder(
            client=client,
            peer_url=fixed_peer_urls({"west": "http://west.test"}),
            source_region="us-east",
            clock=LoopClock(),
            rng=random.Random(1),
            metrics=Metrics("us-east"),
            retries_max=1,
            backoff_s=0.01,
            peer_reachable=lambda region: reachable[region],
            batch_limits=limits,
        )
        request = make_request()
        request.scope["path_params"] = {"conversation_id": "c1"}
        forward = asyncio.create_task(
            batched.forward(
                request,
                target_region="west",
                deadline_s=LoopClock().monotonic() + 30,
                is_write=True,
                batchable=True,
            )
        )
        await arrived.wait()
        reachable["west"] = False
        with pytest.raises(OutcomeUnknown):
            await forward
        await batched.close()


@pytest.mark.parametrize(
    "no_connection",
    [httpx.ConnectError("refused"), httpx.ConnectTimeout("no SYN-ACK")],
    ids=["refused", "timed out"],
)
async def test_a_node_that_refuses_the_forward_is_passed_over_for_its_sibling(
    no_connection: httpx.TransportError,
) -> None:
    """A region's node that died refuses the connection, and one whose host drops packets
    makes none within ``forward_connect_timeout_s``: either way nothing was sent, and the
    retry goes to the node the region's view names next (``RegionNodes.refused``), and
    succeeds there (a timed-out connection is not answered as out of time)."""
    silent: set[str] = set()
    sent: list[str] = []

    def peer_url(region: str, shard: int | None) -> str:
        return "http://west-1.test" if "http://west.test" in silent else "http://west.test"

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.host)
        if request.url.host == "west.test":
            no_connection.request = request
            raise no_connection
        return httpx.Response(201, json={"seq": 1})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        refused = forwarder(client, {"west": True}, peer_url, lambda region, url: silent.add(url))
        reply = await refused.forward(
            make_request(),
            target_region="west",
            shard=3,
            deadline_s=LoopClock().monotonic() + 30,
            is_write=True,
        )
    assert reply.status_code == 201
    assert sent == ["west.test", "west-1.test"]

"""A real node's wiring (``services.bootstrap.open_runtime``) on in-memory adapters: the virtual
loop's clock, a ``MemoryReplica`` per region, and peers reached only through the given transport
(by default none: every peer call fails as unreachable), probes included (``ClientPeerProber``:
production probes open connections of their own, ``services.control.peer_probe``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import httpx

from eventlog.clock import Clock, LoopClock
from eventlog.http_headers import PEER_AUTH_HEADER
from eventlog.memory_replica import MemoryReplica
from services.api.forward_exchange import BatchExchange, HttpxBatchExchange
from services.bootstrap import NodeAdapters, RuntimeFactory, open_runtime
from services.bootstrap.node import TransportWrap
from services.config import ClusterConfig, NodeSettings
from services.control.drills.faults import BlackHole


class Unreachable(httpx.AsyncBaseTransport):
    """No peer answers."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no peer is reachable in this test", request=request)


async def _memory_store(dsn: str, region: str, *, clock: Clock) -> MemoryReplica:
    return MemoryReplica(region)


class ClientPeerProber:
    """The ``PeerProber`` port over an httpx transport: ``GET /peer/health`` of each region's
    peer listener with the peer secret, asking the drills' black-hole first, as production's
    prober does."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport, settings: NodeSettings, cluster: ClusterConfig,
        hole: BlackHole,
    ) -> None:  # fmt: skip
        self._client = httpx.AsyncClient(transport=transport)
        self._urls = {r.name: r.peer_url_for(settings.region) for r in cluster.regions}
        self._timeout_s = settings.probe_timeout_s
        self._headers = {PEER_AUTH_HEADER: cluster.peer_secret} if cluster.peer_secret else {}
        self._hole = hole

    async def health(self, region: str) -> Mapping[str, Any] | None:
        if self._hole.blocks(region, read_only=True) or region not in self._urls:
            return None
        try:
            reply = await self._client.get(
                self._urls[region].rstrip("/") + "/peer/health",
                timeout=self._timeout_s,
                headers=self._headers,
            )
            body = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    async def close(self) -> None:
        await self._client.aclose()


def memory_runtime(peers: httpx.AsyncBaseTransport | None = None) -> RuntimeFactory:
    transport = peers or Unreachable()

    def peer_client(settings: NodeSettings, wrap: TransportWrap | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=wrap(transport) if wrap else transport)

    def peer_prober(
        settings: NodeSettings, cluster: ClusterConfig, hole: BlackHole
    ) -> ClientPeerProber:
        return ClientPeerProber(transport, settings, cluster, hole)

    def forward_exchange(settings: NodeSettings, hole: BlackHole) -> BatchExchange:
        return HttpxBatchExchange(
            httpx.AsyncClient(transport=transport),
            blocked=lambda region: hole.blocks(region, read_only=False),
            owned=True,
        )

    adapters = NodeAdapters(
        clock=LoopClock(),
        open_store=_memory_store,
        peer_client=peer_client,
        peer_prober=peer_prober,
        forward_exchange=forward_exchange,
    )
    return functools.partial(open_runtime, adapters=adapters)

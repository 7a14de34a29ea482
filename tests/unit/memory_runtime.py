"""A real node's wiring (``services.bootstrap.open_runtime``) on in-memory adapters: the virtual
loop's clock, a ``MemoryReplica`` per region, and peers reached only through the given transport
(by default none: every peer call fails as unreachable)."""

from __future__ import annotations

import functools

import httpx

from eventlog.clock import Clock, LoopClock
from eventlog.memory_replica import MemoryReplica
from services.bootstrap import NodeAdapters, RuntimeFactory, open_runtime
from services.bootstrap.node import TransportWrap
from services.config import NodeSettings


class Unreachable(httpx.AsyncBaseTransport):
    """No peer answers."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no peer is reachable in this test", request=request)


async def _memory_store(dsn: str, region: str, *, clock: Clock) -> MemoryReplica:
    return MemoryReplica(region)


def memory_runtime(peers: httpx.AsyncBaseTransport | None = None) -> RuntimeFactory:
    transport = peers or Unreachable()

    def peer_client(settings: NodeSettings, wrap: TransportWrap | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=wrap(transport) if wrap else transport)

    adapters = NodeAdapters(clock=LoopClock(), open_store=_memory_store, peer_client=peer_client)
    return functools.partial(open_runtime, adapters=adapters)

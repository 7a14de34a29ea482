"""The software black-hole of a ``region-loss`` drill, at every node.

While a region-loss drill is injecting or holding (``OpsState.black_holed``), every node drops
what it sends to the target region, and the target drops what it sends to everyone else, at the
two places a node talks to other regions:

* ``BlackHoleReplica`` wraps each region's replica store: calls to a black-holed replica fail
  at once as ``ReplicaUnavailable`` (so the target's own leaders lose their quorum: it fences
  itself), exactly what an unreachable database looks like to the log.
* ``BlackHoleTransport`` wraps the pooled HTTP transport of forwards and drill canaries: a
  request to or from a black-holed region fails as ``httpx.ConnectError``. Probes have their
  own connections (``services.control.peer_probe``) and ask ``BlackHole.blocks`` before each one, so the
  survivors stop hearing the target, suspect it, declare it down by majority and take its
  shards over; detection, takeover and fencing run exactly as for a real loss.

One channel stays open on purpose, and only on the target: it may still *read* other regions'
replicas and probe them, so it learns from the control shard that the drill ended the moment it
does (a real loss has no such channel; without it an aborted drill would leave the target cut
off until its deadline). Reads neither acknowledge nor fence anything. The black-hole also ends
by itself at the drill's deadline (``Drill.fault_active``), whatever the control shard says.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar
from urllib.parse import urlsplit

import httpx

from eventlog.clock import Clock
from eventlog.errors import ReplicaUnavailable
from eventlog.replica import ReplicaStore, ReplicaStoreWrapper
from regions.ops_state import OpsState

T = TypeVar("T")


class BlackHole:
    """Which calls this node must drop now."""

    def __init__(self, *, region: str, ops: OpsState, clock: Clock) -> None:
        self.region = region
        self._ops = ops
        self._clock = clock

    def holed(self) -> frozenset[str]:
        return self._ops.black_holed(self._clock.wall_ms())

    def blocks(self, target_region: str, *, read_only: bool) -> bool:
        """Whether a call from this node to ``target_region`` is dropped."""
        if target_region == self.region:
            return False  # a node always reaches its own region's database
        holed = self.holed()
        if target_region in holed:
            return True
        return self.region in holed and not read_only


class BlackHoleReplica(ReplicaStoreWrapper):
    """A replica store whose calls are dropped while the black-hole covers its region."""

    def __init__(self, inner: ReplicaStore, hole: BlackHole) -> None:
        super().__init__(inner)
        self._hole = hole

    async def around(self, call: str, read_only: bool, thunk: Callable[[], Awaitable[T]]) -> T:
        if self._hole.blocks(self.region, read_only=read_only):
            raise ReplicaUnavailable(f"replica {self.region} is black-holed by a drill")
        return await thunk()


def black_holed_replicas(
    replicas: Mapping[str, ReplicaStore], hole: BlackHole
) -> dict[str, ReplicaStore]:
    return {region: BlackHoleReplica(store, hole) for region, store in replicas.items()}


class BlackHoleTransport(httpx.AsyncBaseTransport):
    """An HTTP transport that drops requests to black-holed regions (by their URL's host and
    port) and, on the target itself, everything it sends to others."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        hole: BlackHole,
        region_of: Callable[[str], str | None],
    ) -> None:
        self._inner = inner
        self._hole = hole
        self._region_of = region_of

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        region = self._region_of(f"{request.url.host}:{request.url.port}")
        if region is not None and self._hole.blocks(region, read_only=False):
            raise httpx.ConnectError(f"{region} is black-holed by a drill", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def region_by_address(*url_maps: Mapping[str, str]) -> Callable[[str], str | None]:
    """``host:port`` -> region, from each region's base URLs as this node reaches them (its
    client listener and its peer listener: probes and forwards use the latter)."""
    by_address: dict[str, str] = {}
    for urls in url_maps:
        for region, url in urls.items():
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            by_address[f"{parts.hostname}:{port}"] = region
    return by_address.get

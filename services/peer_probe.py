"""How a node asks a peer for its health: a one-method port, and its HTTP adapter.

The controller only needs "what does region R's node say about itself right now" (its suspects,
the shards it leads, its placement version, its unhealthy loops). ``HttpPeerProber`` asks
``GET /peer/health`` over the node's pooled client with the peer secret and a deadline; the
whole-plane simulator (``services.plane_sim``) answers from the peer controller through its
simulated network instead, so the same controller code runs on virtual time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from eventlog.http_headers import PEER_AUTH_HEADER


class PeerProber(Protocol):
    async def health(self, region: str) -> Mapping[str, Any] | None:
        """The peer's health reply, or None when it did not answer (in time, or at all)."""


class HttpPeerProber:
    def __init__(
        self,
        client: httpx.AsyncClient,
        urls: Mapping[str, str],
        *,
        timeout_s: float,
        peer_secret: str | None,
    ) -> None:
        self._client = client
        self._urls = {region: url.rstrip("/") + "/peer/health" for region, url in urls.items()}
        self._timeout_s = timeout_s
        # the header name is services.api.forwarding.PEER_AUTH_HEADER (not imported: the API
        # layer sits above the controller)
        self._headers = {PEER_AUTH_HEADER: peer_secret} if peer_secret else {}

    async def health(self, region: str) -> Mapping[str, Any] | None:
        try:
            reply = await self._client.get(
                self._urls[region], timeout=self._timeout_s, headers=self._headers
            )
            body = reply.json() if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

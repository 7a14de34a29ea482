"""What each of a node's two listeners lets through to the app (``services.listeners``).

* ``ClientListenerGate`` (the client listener): no ``/peer/`` path at all. Those are answered
  404 before anything else happens: no body is read, no admission slot is taken, and nothing a
  client sends there (the peer secret included) reaches a peer endpoint.
* ``PeerListenerGate`` (the peer listener): a request is refused 401, before its body is read
  and before it takes any slot, unless it carries the cluster's peer secret and names a region
  of the cluster in ``X-Convplane-Source-Region``; with the cluster's TLS the listener already
  required a client certificate from the cluster CA, and the gate also requires that the
  certificate's region identity (``services.cluster_tls.region_of_certificate``) be the region
  claimed. An authenticated request carries the peer's region in the scope
  (``services.api.peer_trust``): the only thing the app trusts as a peer's.

Without TLS (a development plane) the peer listener trusts the secret alone; ``services.bootstrap.serve``
then binds it to loopback only and says so loudly at start (``docs/security.md``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from eventlog.http_headers import PEER_AUTH_HEADER, SOURCE_REGION_HEADER
from services.api.peer_trust import CERT_REGION_SCOPE_KEY, PEER_REGION_SCOPE_KEY

_PEER_AUTH = PEER_AUTH_HEADER.lower().encode()
_SOURCE_REGION = SOURCE_REGION_HEADER.lower().encode()
PEER_PATH_PREFIX = "/peer/"


class ClientListenerGate:
    """The client listener's app: the node's app, less every peer endpoint (404)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PEER_PATH_PREFIX):
            await refuse(send, 404, "not_found", "no such route on this listener")
            return
        await self.app(scope, receive, send)


class PeerListenerGate:
    """The peer listener's app: the node's app, for the cluster's nodes only (module
    docstring). ``tls``: the listener requires client certificates (the identity check)."""

    def __init__(
        self, app: ASGIApp, *, peer_secret: str, regions: Iterable[str], tls: bool
    ) -> None:
        self.app = app
        self._secret = peer_secret.encode()
        self._regions = frozenset(regions)
        self._tls = tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            region = self._authenticated_region(scope)
            if region is None:
                message = "the peer listener serves nodes of the cluster only"
                await refuse(send, 401, "unauthorized", message)
                return
            scope[PEER_REGION_SCOPE_KEY] = region
        await self.app(scope, receive, send)

    def _authenticated_region(self, scope: Scope) -> str | None:
        headers = scope.get("headers", ())
        secrets = [bytes(v) for k, v in headers if bytes(k) == _PEER_AUTH]
        claims = [bytes(v).decode("latin-1") for k, v in headers if bytes(k) == _SOURCE_REGION]
        if len(secrets) != 1 or not hmac.compare_digest(secrets[0], self._secret):
            return None
        if len(claims) != 1 or claims[0] not in self._regions:
            return None
        if self._tls and scope.get(CERT_REGION_SCOPE_KEY) != claims[0]:
            return None  # a certificate speaks for its own region only
        return claims[0]


async def refuse(send: Send, status: int, code: str, message: str) -> None:
    """A JSON error, and the connection closed (whatever body follows is never read)."""
    body = json.dumps({"error": {"code": code, "message": message, "retryable": False}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

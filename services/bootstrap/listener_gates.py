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

An authenticated peer whose protocol is outside this node's window
(``services.peer_protocol``) is refused 409, also before its body, with both versions named,
and the refusal is logged (once a minute per peer and version); every answer of the peer
listener says which protocol this node speaks.

Without TLS (a development plane) the peer listener trusts the secret alone; ``services.bootstrap.serve``
then binds it to loopback only and says so loudly at start (``docs/security.md``).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventlog.errors import error_body
from eventlog.http_headers import PEER_AUTH_HEADER, SOURCE_REGION_HEADER
from services.api.peer_trust import CERT_REGION_SCOPE_KEY, PEER_REGION_SCOPE_KEY
from services.peer_protocol import (
    OLDEST_HEADER,
    PROTOCOL_HEADER,
    PROTOCOL_REFUSED,
    PROTOCOL_REFUSED_STATUS,
    THIS_NODE,
    Speaks,
    peer_speaks,
    refusal,
)

log = logging.getLogger("convplane.peer_protocol")
#: a refused peer's protocol is logged at most this often per (region, its versions)
PROTOCOL_REFUSAL_LOG_EVERY_S = 60.0

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
        self,
        app: ASGIApp,
        *,
        peer_secret: str,
        regions: Iterable[str],
        tls: bool,
        speaks: Speaks = THIS_NODE,
    ) -> None:
        self.app = app
        self._secret = peer_secret.encode()
        self._regions = frozenset(regions)
        self._tls = tls
        self._speaks = speaks
        self._protocol_headers = [
            (PROTOCOL_HEADER.lower().encode(), str(speaks.protocol).encode()),
            (OLDEST_HEADER.lower().encode(), str(speaks.oldest).encode()),
        ]
        self._logged_s: dict[tuple[str, Speaks | None], float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            region = self._authenticated_region(scope)
            if region is None:
                message = "the peer listener serves nodes of the cluster only"
                await refuse(send, 401, "unauthorized", message)
                return
            if (why := self._protocol_refusal(scope, region)) is not None:
                await refuse(
                    send, PROTOCOL_REFUSED_STATUS, PROTOCOL_REFUSED, why, self._protocol_headers
                )
                return
            scope[PEER_REGION_SCOPE_KEY] = region
            send = _with_headers(send, self._protocol_headers)
        await self.app(scope, receive, send)

    def _protocol_refusal(self, scope: Scope, region: str) -> str | None:
        """Why the peer's protocol is refused (None: it is served); logged when refused."""
        peer = peer_speaks(scope.get("headers", ()))
        if peer is None:
            why = f"region {region} sent peer protocol headers no convplane node sends"
        elif (why_not := refusal(peer, region, self._speaks)) is None:
            return None
        else:
            why = why_not
        now_s = time.monotonic()
        if now_s - self._logged_s.get((region, peer), -PROTOCOL_REFUSAL_LOG_EVERY_S) >= (
            PROTOCOL_REFUSAL_LOG_EVERY_S
        ):
            self._logged_s[(region, peer)] = now_s
            log.error("peer call refused: %s", why)
        return why

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


def _with_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` that adds ``headers`` to the answer's head (this node's peer protocol)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return sending


async def refuse(
    send: Send,
    status: int,
    code: str,
    message: str,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """A JSON error, and the connection closed (whatever body follows is never read)."""
    body = json.dumps(error_body(code, message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

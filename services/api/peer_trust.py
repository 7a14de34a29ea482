"""Who a request comes from, as the listeners established it (``services.bootstrap.listener_gates``).

The app trusts a request as a peer node's only when the peer listener's gate says so: the gate
sets ``PEER_REGION_SCOPE_KEY`` to the region the caller proved it is (its certificate, with the
cluster's TLS; the peer secret, on a loopback-only plane without TLS). No header a client can
send grants it: the peer secret alone, or ``X-Convplane-Forwarded`` on the client listener, is
nothing. Every peer call names its own region in ``SOURCE_REGION_HEADER``; with TLS the gate
refuses a claim that is not the certificate's region.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# spelled with the other header names; named here too for the peer-call modules that import
# it with the scope keys below
from eventlog.http_headers import SOURCE_REGION_HEADER as SOURCE_REGION_HEADER

#: the scope key under which the peer listener's gate leaves the authenticated peer's region
PEER_REGION_SCOPE_KEY = "convplane.peer_region"
#: the scope key under which a TLS listener leaves the region its client's certificate names
CERT_REGION_SCOPE_KEY = "convplane.cert_region"


def peer_region(scope: Mapping[str, Any]) -> str | None:
    """The peer region the gate authenticated this request as; None: not a peer's."""
    region = scope.get(PEER_REGION_SCOPE_KEY)
    return region if isinstance(region, str) and region else None

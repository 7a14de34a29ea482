"""The peer protocol's version: which nodes of other convplane versions a node works with.

Nodes of one plane run different versions while it is upgraded region by region
(docs/upgrade-backup-restore.md), so every peer call says what its caller speaks: its protocol
(``PROTOCOL_HEADER``) and the oldest protocol it still serves (``OLDEST_HEADER``), and so does
every answer of the peer listener. Two nodes work together when each one's protocol is at least
the other's oldest: a node keeps serving (and speaking to) peers down to ``PEER_PROTOCOL_OLDEST``,
and a newer node that cannot serve this one any more says so with its own oldest.

A call without the headers is of protocol 1, its oldest 1: nodes of convplane before the
protocol was versioned (commit 83d929a and earlier) send none, and they are inside this
version's window, so a plane of that version upgrades to this one region by region.

Outside the window the peer listener refuses the call before its body is read
(``services.bootstrap.listener_gates``): a 409 whose JSON error (``PROTOCOL_REFUSED``, not retryable)
names both sides' versions and windows, logged at the refusing node; a forward's caller relays
it to its client, a probe's logs it (``services.control.peer_probe``). 409 and not 400: a refusal
here says nothing of whether an earlier, lost attempt of the same append was applied by the
node before it was replaced (``services.api.forward_batch.settles_outcome``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: the peer protocol this version speaks. Raise it when a peer call or answer changes in a way
#: a node of the previous protocol would misread; raise ``PEER_PROTOCOL_OLDEST`` only when this
#: version no longer serves nodes of that protocol (then an upgrade must pass through a version
#: whose window holds both)
PEER_PROTOCOL = 2
#: the oldest peer protocol this version serves: the rolling-upgrade window is
#: [PEER_PROTOCOL_OLDEST, PEER_PROTOCOL] (and nodes of newer protocols whose oldest is in it)
PEER_PROTOCOL_OLDEST = 1
#: what a call without the headers speaks (nodes before the protocol was versioned)
UNVERSIONED_PROTOCOL = 1

PROTOCOL_HEADER = "X-Convplane-Peer-Protocol"
OLDEST_HEADER = "X-Convplane-Peer-Protocol-Oldest"
PROTOCOL_REFUSED = "peer_protocol_unsupported"
PROTOCOL_REFUSED_STATUS = 409

#: the headers every peer call and every peer listener answer carries
PEER_PROTOCOL_HEADERS = {
    PROTOCOL_HEADER: str(PEER_PROTOCOL),
    OLDEST_HEADER: str(PEER_PROTOCOL_OLDEST),
}


@dataclass(frozen=True, slots=True)
class Speaks:
    """A node's peer protocol and the oldest it serves."""

    protocol: int
    oldest: int


THIS_NODE = Speaks(PEER_PROTOCOL, PEER_PROTOCOL_OLDEST)


def peer_speaks(headers: Iterable[tuple[bytes, bytes]]) -> Speaks | None:
    """What a caller speaks, from its request's raw headers; None: headers no node sends (not a
    number, repeated, an oldest above the protocol)."""
    found: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        lowered = bytes(name).lower()
        if lowered in _NAMES:
            found.setdefault(lowered, []).append(bytes(value))
    protocol = _one_number(found.get(_PROTOCOL))
    oldest = _one_number(found.get(_OLDEST))
    if protocol is None or oldest is None:
        return None
    if protocol == 0:  # no protocol header: a node before versioning
        protocol = UNVERSIONED_PROTOCOL
    if oldest == 0:
        oldest = min(protocol, UNVERSIONED_PROTOCOL)
    return Speaks(protocol, oldest) if 1 <= oldest <= protocol else None


def refusal(peer: Speaks, region: str, here: Speaks = THIS_NODE) -> str | None:
    """Why a peer of ``region`` speaking ``peer`` cannot work with this node (None: it can);
    the message names both versions and both windows."""
    if peer.protocol < here.oldest:
        return (
            f"region {region} speaks peer protocol {peer.protocol}, older than this node "
            f"serves (it speaks {here.protocol} and serves protocols {here.oldest} to "
            f"{here.protocol}): upgrade {region} through a version whose window holds both"
        )
    if peer.oldest > here.protocol:
        return (
            f"region {region} speaks peer protocol {peer.protocol} and serves protocols "
            f"{peer.oldest} to {peer.protocol} only; this node speaks {here.protocol} (serves "
            f"{here.oldest} to {here.protocol}): upgrade this node first"
        )
    return None


_PROTOCOL = PROTOCOL_HEADER.lower().encode()
_OLDEST = OLDEST_HEADER.lower().encode()
_NAMES = frozenset({_PROTOCOL, _OLDEST})


def _one_number(values: list[bytes] | None) -> int | None:
    """0 for no value; None for a value that is not one positive number."""
    if values is None:
        return 0
    if len(values) != 1 or not values[0].strip().isdigit():
        return None
    number = int(values[0])
    return number if number >= 1 else None

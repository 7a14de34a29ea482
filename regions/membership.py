"""Failure detection: who is suspected, and who is declared down by a majority. Pure, no I/O.

Every node probes every peer (``GET /peer/health``) every ``probe_interval_s``; the adapter
(``services.control.controller``) feeds each result in here with the injected clock's time. A peer with
no successful probe for ``detection_s`` is *suspected* by this node. Each health reply carries
the responder's own suspect set, so every node knows who suspects whom (as of its last reply).

A region is *declared down* only when a majority of all regions (counting this node) suspects
it. A minority's suspicion is never enough: a node cut off from the rest suspects everyone, but
nobody else agrees, so it declares nobody down (and, by the log's quorums, could commit nothing
even if it did).

A peer never heard from since this node started is not suspected before ``never_seen_grace_s``:
nodes of a cluster start at slightly different times, and a slow starter must not be failed over
before it had a chance to answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

RegionStatus = Literal["up", "suspected", "down"]


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    #: a peer without a successful probe for this long is suspected
    detection_s: float = 1.0
    #: a peer never heard from is not suspected before this long after start
    never_seen_grace_s: float = 5.0


@dataclass(frozen=True, slots=True)
class RegionView:
    name: str
    status: RegionStatus
    suspected_by: tuple[str, ...]  # regions (possibly including this one) that suspect it


@dataclass(slots=True)
class _Peer:
    last_ok_s: float | None = None
    #: the peer's own suspect set, as of its last reply
    suspects: frozenset[str] = frozenset()
    #: shards the peer said it leads, as of its last reply
    led_shards: frozenset[int] = frozenset()
    replied_at_s: float | None = None


class Membership:
    """This node's view of every region's health."""

    def __init__(
        self,
        *,
        self_region: str,
        regions: Iterable[str],
        config: MembershipConfig,
        started_s: float,
    ) -> None:
        self.self_region = self_region
        self.regions = tuple(sorted(set(regions)))
        if self_region not in self.regions:
            raise ValueError(f"region {self_region!r} is not a member")
        if config.detection_s <= 0:
            raise ValueError("detection_s must be > 0")
        self.config = config
        self._started_s = started_s
        self._peers = {r: _Peer() for r in self.regions if r != self_region}

    @property
    def majority(self) -> int:
        return len(self.regions) // 2 + 1

    # --- inputs ---------------------------------------------------------------------------

    def probe_ok(
        self,
        region: str,
        now_s: float,
        *,
        suspects: Iterable[str],
        led_shards: Iterable[int] = (),
    ) -> None:
        """A successful probe of ``region`` at ``now_s``; its reply named its own suspects."""
        peer = self._peer(region)
        peer.last_ok_s = now_s if peer.last_ok_s is None else max(peer.last_ok_s, now_s)
        peer.replied_at_s = now_s
        # A peer never suspects itself; ignore unknown names rather than trusting them.
        peer.suspects = frozenset(s for s in suspects if s in self.regions and s != region)
        peer.led_shards = frozenset(led_shards)

    def probe_failed(self, region: str, now_s: float) -> None:
        """A failed probe changes nothing by itself: suspicion is the *absence* of success."""
        self._peer(region)

    # --- views ----------------------------------------------------------------------------

    def suspects(self, now_s: float) -> frozenset[str]:
        """Peers this node suspects now."""
        return frozenset(r for r, p in self._peers.items() if self._suspected(p, now_s))

    def suspects_region(self, region: str, now_s: float) -> bool:
        """Whether ``region`` is in ``suspects(now_s)``, without building the set (a shard
        leader asks on every proposal)."""
        peer = self._peers.get(region)
        return peer is not None and self._suspected(peer, now_s)

    def suspected_by(self, region: str, now_s: float) -> tuple[str, ...]:
        """Regions that suspect ``region``: this node by its own probes, peers by their last
        reply. A peer this node suspects is still counted with its last known suspicions."""
        who = []
        for name in self.regions:
            if name == region:
                continue
            if name == self.self_region:
                if region in self.suspects(now_s):
                    who.append(name)
            elif region in self._peers[name].suspects:
                who.append(name)
        return tuple(who)

    def declared_down(self, now_s: float) -> frozenset[str]:
        """Regions a majority of all regions suspects. This node itself is never in it: a node
        that can answer is, by its own lights, up; the others decide without it."""
        return frozenset(
            r
            for r in self.regions
            if r != self.self_region and len(self.suspected_by(r, now_s)) >= self.majority
        )

    def status(self, region: str, now_s: float) -> RegionStatus:
        if region in self.declared_down(now_s):
            return "down"
        if region != self.self_region and region in self.suspects(now_s):
            return "suspected"
        return "up"

    def view(self, now_s: float) -> dict[str, RegionView]:
        return {
            r: RegionView(r, self.status(r, now_s), self.suspected_by(r, now_s))
            for r in self.regions
        }

    def alive(self, now_s: float) -> list[str]:
        """Regions not declared down, by name."""
        down = self.declared_down(now_s)
        return [r for r in self.regions if r not in down]

    def led_shards_of(self, region: str) -> frozenset[int]:
        """Shards ``region`` said it leads in its last reply (empty if never heard)."""
        return self._peer(region).led_shards

    def last_heard_s(self, region: str) -> float | None:
        """When ``region`` last answered a probe (None: never, or it is this node's region)."""
        if region == self.self_region:
            return None
        return self._peer(region).last_ok_s

    def heard_since(self, region: str, since_s: float) -> bool:
        """Whether ``region`` replied to a probe at or after ``since_s``."""
        replied = self._peer(region).replied_at_s
        return replied is not None and replied >= since_s

    # --- helpers --------------------------------------------------------------------------

    def _peer(self, region: str) -> _Peer:
        peer = self._peers.get(region)
        if peer is None:
            raise ValueError(f"{region!r} is not a peer of {self.self_region!r}")
        return peer

    def _suspected(self, peer: _Peer, now_s: float) -> bool:
        if peer.last_ok_s is None:
            return now_s - self._started_s >= max(
                self.config.never_seen_grace_s, self.config.detection_s
            )
        return now_s - peer.last_ok_s >= self.config.detection_s


def statuses(views: Mapping[str, RegionView]) -> dict[str, RegionStatus]:
    return {name: v.status for name, v in views.items()}

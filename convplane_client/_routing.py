"""Which region to send a conversation's next request to, pure (no I/O, time passed in).

Any region accepts any request and forwards it to the conversation's leader, so routing is an
optimisation plus a fallback, never a correctness condition: the table remembers, per
conversation, the region that serves it (from ``/route``, a create's ``leader_region``, a
``not_leader`` hint and every answer's ``X-Convplane-Served-By``), sends there while that region
answers, and otherwise falls back to the first region, in the caller's order, that has not
failed to answer within ``region_unreachable_s``.

A region may be given several node URLs (a region of several nodes: ``convplane up
--nodes-per-region``). A node that does not answer passes the region's traffic to its next
node; the region counts as not answering only once each of its nodes failed in a row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

#: a region's base url, or its nodes' (the first tried first)
RegionUrls = str | Sequence[str]


class RoutingTable:
    def __init__(
        self, regions: Mapping[str, RegionUrls], *, routes_max: int, region_unreachable_s: float
    ) -> None:
        if not regions:
            raise ValueError("the client needs at least one region: {name: base url}")
        self._nodes = {
            name: [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
            for name, urls in regions.items()
        }
        if not all(self._nodes.values()):
            raise ValueError("every region needs at least one url")
        #: the url each region's requests go to now: its node that last answered
        self.urls = {name: nodes[0] for name, nodes in self._nodes.items()}
        #: nodes of each region that failed in a row since one answered
        self._failed_in_row: dict[str, int] = {}
        self._order = list(self.urls)
        self._routes_max = routes_max
        self._unreachable_s = region_unreachable_s
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._unreachable_until: dict[str, float] = {}
        # the sync client may be shared by threads; the table's updates are a few dict operations
        self._lock = threading.Lock()

    def routed(self, conversation_id: str) -> str | None:
        with self._lock:
            return self._routes.get(conversation_id)

    def region_for(self, conversation_id: str | None, now_s: float) -> str:
        """The routed region while it answers; else the first region in the caller's order
        that answers; when none does, the one whose failure is oldest."""
        with self._lock:
            routed = self._routes.get(conversation_id) if conversation_id else None
            if routed is not None:
                self._routes.move_to_end(conversation_id)  # type: ignore[arg-type]
                if self._unreachable_until.get(routed, 0.0) <= now_s:
                    return routed
            for name in self._order:
                if self._unreachable_until.get(name, 0.0) <= now_s:
                    return name
            return min(self._order, key=lambda name: self._unreachable_until[name])

    def learn(self, conversation_id: str | None, region: str | None) -> None:
        """Remember that ``region`` serves the conversation (ignored for a region the client
        was not given: it could not send there)."""
        if conversation_id is None or region not in self.urls:
            return
        with self._lock:
            self._routes[conversation_id] = region
            self._routes.move_to_end(conversation_id)
            while len(self._routes) > self._routes_max:
                self._routes.popitem(last=False)

    def unreachable(self, region: str, conversation_id: str | None, now_s: float) -> None:
        """``region`` did not answer: its next node takes its traffic, if it has one that has
        not failed since one answered; else pass the region over for a while, and forget it as
        the conversation's route (the next answer teaches the new one)."""
        with self._lock:
            nodes = self._nodes[region]
            failed = self._failed_in_row.get(region, 0) + 1
            self._failed_in_row[region] = failed
            if len(nodes) > 1:
                self.urls[region] = nodes[(nodes.index(self.urls[region]) + 1) % len(nodes)]
                if failed < len(nodes):
                    return
            self._unreachable_until[region] = now_s + self._unreachable_s
            if conversation_id is not None and self._routes.get(conversation_id) == region:
                del self._routes[conversation_id]

    def answered(self, region: str) -> None:
        with self._lock:
            self._unreachable_until.pop(region, None)
            self._failed_in_row.pop(region, None)

    def any_reachable(self, now_s: float) -> bool:
        with self._lock:
            return any(self._unreachable_until.get(n, 0.0) <= now_s for n in self._order)

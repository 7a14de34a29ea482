"""A region's nodes as its peers see them: where each listens, and which slot each one leads.

A region may run several nodes on its one replica database (``RegionConfig.more_nodes``). The
shards placed on a region of N nodes fall into N node slots (``regions.placement.SlotMap``);
the node that holds a slot's lease (``eventlog.stores.region_lease``) leads that slot's shards.
Node ``i`` holds slot ``i`` while it lives; a sibling takes the slot of a node that died and
hands it back once that node asks for it again. Peers probe every node of the region and send
each shard's traffic to the node whose last health reply said it holds the shard's slot
(``RegionNodes.heard``).

A probe target names one node: the region's name for its first node (so a region of one node
is probed, black-holed and counted exactly as before) and ``region/index`` for the others.
Region names cannot hold a slash (``services.config.RegionName``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from regions.placement import SlotMap
from services.config import ClusterConfig

#: (region, shard) -> the peer URL of the node of ``region`` that leads ``shard`` while the
#: region does (shard None: the control shard's node); None: no such region
PeerUrlOf = Callable[[str, int | None], str | None]


def fixed_peer_urls(urls: Mapping[str, str]) -> PeerUrlOf:
    """Regions of one node each, at fixed peer URLs."""
    return lambda region, _shard: urls.get(region)


def node_target(region: str, index: int) -> str:
    """The probe target of ``region``'s node ``index``."""
    return region if index == 0 else f"{region}/{index}"


def target_region(target: str) -> str:
    """The region a probe target belongs to."""
    return target.partition("/")[0]


class RegionNodes:
    """Each region's nodes' peer URLs (as ``source_region`` reaches them) and which node holds
    each of its node slots by the last health replies heard."""

    def __init__(
        self,
        cluster: ClusterConfig,
        source_region: str,
        *,
        lost_after_s: float = 1.0,
        now_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``lost_after_s``: a node silent this long is ``lost`` (``detection_s``);
        ``now_s``: the node's monotonic clock."""
        self._peer_urls = {r.name: r.node_peer_urls(source_region) for r in cluster.regions}
        #: region -> slot -> the node index last heard holding it (at first: slot i, node i)
        self._holders: dict[str, list[int]] = {
            r.name: list(range(r.node_count)) for r in cluster.regions
        }
        self._control_shard = cluster.shard_count
        self.slot_map = SlotMap(cluster.shard_count, cluster.weights())
        self._source_region = source_region
        #: region -> the nodes that did not answer their last probe, or refused a forward
        #: since, each with when it went silent
        self._silent: dict[str, dict[int, float]] = {r.name: {} for r in cluster.regions}
        self._lost_after_s = lost_after_s
        self._now_s = now_s

    def regions(self) -> list[str]:
        return list(self._peer_urls)

    def node_count(self, region: str) -> int:
        return len(self._peer_urls[region])

    def targets(self, region: str) -> list[str]:
        """Every node of ``region`` as a probe target, its first node first."""
        return [node_target(region, i) for i in range(self.node_count(region))]

    def target_urls(self) -> dict[str, str]:
        """probe target -> peer URL, for every node of every region."""
        return {
            node_target(region, i): url
            for region, urls in self._peer_urls.items()
            for i, url in enumerate(urls)
        }

    def heard(self, region: str, index: int, slots: Iterable[int]) -> None:
        """Node ``index`` of ``region`` said it holds ``slots``."""
        holders = self._holders[region]
        if not 0 <= index < len(holders):
            return
        for slot in slots:
            if isinstance(slot, int) and 0 <= slot < len(holders):
                holders[slot] = index

    def leading_node(self, region: str, shard: int | None = None) -> int:
        """The node of ``region`` that leads ``shard`` (as last heard) while the region leads
        it; None: the control shard."""
        shard = self._control_shard if shard is None else shard
        return self._holders[region][self.slot_map.slot(shard, self.node_count(region))]

    def answering(self, region: str, index: int, answers: bool) -> None:
        """Whether node ``index`` of ``region`` answered its last probe."""
        silent = self._silent.get(region)
        if silent is None:
            return
        if answers:
            silent.pop(index, None)
        else:
            silent.setdefault(index, self._now_s())

    def refused(self, region: str, url: str) -> None:
        """The node of ``region`` at peer URL ``url`` refused a connection: silent until it
        answers a probe again."""
        index = self._index_of(region, url)
        if index is not None:
            self._silent[region].setdefault(index, self._now_s())

    def lost(self, region: str, url: str) -> bool:
        """Whether the node of ``region`` at peer URL ``url`` has been silent for
        ``lost_after_s``: a forward in flight to it is given up (its host died or drops
        packets, and nothing else would end the wait before the caller's deadline)."""
        index = self._index_of(region, url)
        since_s = None if index is None else self._silent[region].get(index)
        return since_s is not None and self._now_s() - since_s >= self._lost_after_s

    def _index_of(self, region: str, url: str) -> int | None:
        for index, node_url in enumerate(self._peer_urls.get(region, [])):
            if node_url.rstrip("/") == url.rstrip("/"):
                return index
        return None

    def peer_url(self, region: str, shard: int | None = None) -> str:
        """The peer URL of the node of ``region`` leading ``shard`` (None: the control shard).
        While that node is silent (it died) and another node of that region answers, that
        one: it leads the shard once it has taken the dead node's slot (a request waits for a
        lead under way there), and until then sends the request on to the slot's holder (one
        hop inside its region). A node handles a silent sibling of its own region itself
        (``services.api.context``)."""
        urls = self._peer_urls[region]
        holder = self.leading_node(region, shard)
        silent = self._silent[region]
        if holder in silent and region != self._source_region:
            holder = next((i for i in range(len(urls)) if i not in silent), holder)
        return urls[holder]

    def peer_url_of(self) -> PeerUrlOf:
        """``peer_url``, read live (forwarders, the drill driver and its canaries keep it)."""

        def peer_url(region: str, shard: int | None) -> str | None:
            return self.peer_url(region, shard) if region in self._peer_urls else None

        return peer_url

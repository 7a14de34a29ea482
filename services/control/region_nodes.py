"""A region's nodes as its peers see them: where each listens, and which one leads the region.

A region may run several nodes on its one replica database (``RegionConfig.more_nodes``). One of
them holds the region's lease (``eventlog.stores.region_lease``) and leads every shard placed on
the region; the others stand by, answer probes and forward what they are sent to the lease
holder. Its peers probe every node of the region and say where the region's traffic goes: to
the node whose last health reply said it leads the region (``RegionNodes.heard``).

A probe target names one node: the region's name for its first node (so a region of one node
is probed, black-holed and counted exactly as before) and ``region/index`` for the others.
Region names cannot hold a slash (``services.config.RegionName``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from services.config import ClusterConfig


def node_target(region: str, index: int) -> str:
    """The probe target of ``region``'s node ``index``."""
    return region if index == 0 else f"{region}/{index}"


def target_region(target: str) -> str:
    """The region a probe target belongs to."""
    return target.partition("/")[0]


class RegionNodes:
    """Each region's nodes' peer URLs (as ``source_region`` reaches them) and which node leads
    the region by the last health replies heard."""

    def __init__(self, cluster: ClusterConfig, source_region: str) -> None:
        self._peer_urls = {r.name: r.node_peer_urls(source_region) for r in cluster.regions}
        self._leading: dict[str, int] = {r.name: 0 for r in cluster.regions}

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

    def heard(self, region: str, index: int) -> None:
        """Node ``index`` of ``region`` said it leads the region."""
        if 0 <= index < self.node_count(region):
            self._leading[region] = index

    def leading_node(self, region: str) -> int:
        return self._leading[region]

    def peer_url(self, region: str) -> str:
        """The peer URL of the node leading ``region`` (as last heard)."""
        return self._peer_urls[region][self._leading[region]]

    def peer_urls(self) -> Mapping[str, str]:
        """region -> the peer URL of its leading node, read live (a forwarder keeps it)."""
        return _LeadingUrls(self)


class _LeadingUrls(Mapping[str, str]):
    def __init__(self, nodes: RegionNodes) -> None:
        self._nodes = nodes

    def __getitem__(self, region: str) -> str:
        try:
            return self._nodes.peer_url(region)
        except KeyError:
            raise KeyError(region) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes.regions())

    def __len__(self) -> int:
        return len(self._nodes.regions())

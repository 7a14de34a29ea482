"""What the whole-plane simulation adds to the log simulator's network: node-to-node probes.

Replica calls go through ``eventlog.sim.network.SimNetwork`` (delay, loss, duplication, cuts,
crashed databases). A node's health probe of a peer goes through the same cuts (a directed pair
``(src, dst)`` in ``SimNetwork.cut`` drops traffic from ``src`` to ``dst``, so a one-way
partition is one pair) and fails while the peer's node process is down or paused, or either
end's network is frozen (``SimNetwork.frozen``: a paused node, or a blip of its network).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from eventlog.sim.network import SimNetwork
from services.control.region_nodes import target_region

#: a probe that is lost never gets a reply; the prober's deadline ends the wait
_LOST_S = 3600.0


class SimProber:
    """The ``PeerProber`` port of node ``src`` on the simulated network."""

    def __init__(
        self,
        net: SimNetwork,
        src: str,
        health_of: Callable[[str, str], Mapping[str, Any] | None],
        *,
        blocked: Callable[[str], bool] = lambda region: False,
    ) -> None:
        self._net = net
        self._src = src
        #: (target, asking region) -> its reply; None while that node is down or paused
        self._health_of = health_of
        #: a drill's black-hole drops the probe at once (as ``HttpPeerProber``'s ``blocked``)
        self._blocked = blocked

    async def health(self, target: str) -> Mapping[str, Any] | None:
        """``target``: a region's node (``services.control.region_nodes.node_target``); cuts
        are between regions, freezes of single nodes."""
        net = self._net
        region, src_region = target_region(target), target_region(self._src)
        if self._blocked(region):
            return None
        await asyncio.sleep(net.rng.uniform(net.faults.delay_min_s, net.faults.delay_max_s))
        if (
            self._src in net.frozen
            or target in net.frozen
            or (src_region, region) in net.cut
            or net.rng.random() < net.faults.drop_p
        ):
            await asyncio.sleep(_LOST_S)
        reply = self._health_of(target, src_region)
        if reply is None:
            await asyncio.sleep(_LOST_S)
        await asyncio.sleep(net.rng.uniform(net.faults.delay_min_s, net.faults.delay_max_s))
        if (region, src_region) in net.cut or self._src in net.frozen or target in net.frozen:
            await asyncio.sleep(_LOST_S)
        return reply

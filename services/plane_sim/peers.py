"""The drill driver's peer calls on the simulated network.

A drill driver asks other nodes to write and read its canaries (``/peer/drills/canary``) and
for their load (``/peer/drills/load``) over the pooled HTTP client. In the simulation that
client's transport is ``SimPeerTransport``: it crosses the same cuts as probes and replica
calls, then does in-process what the peer route does (``services.api.drill_routes``) on the
named region's log node. A call that cannot arrive fails at once as ``httpx.ConnectError``
(the driver has a deadline on every call, which this transport does not run on virtual time
for it); one that runs longer than its timeout fails as ``httpx.ReadTimeout``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from eventlog.errors import ConvplaneError
from eventlog.node import LogNode
from eventlog.sim.network import SimNetwork
from services.control.drills.canary import append_canary, read_canary
from services.control.drills.load import LOAD_PATH

CANARY_PATH = "/peer/drills/canary"
#: a call without a timeout of its own (the driver always passes one)
DEFAULT_TIMEOUT_S = 5.0


class SimPeerTransport(httpx.AsyncBaseTransport):
    """Node ``src``'s peer HTTP transport: ``http://<region>.sim/...`` reaches ``region``."""

    def __init__(
        self,
        net: SimNetwork,
        src: str,
        node_of: Callable[[str, int | None], LogNode | None],
        model_revision: str,
    ) -> None:
        self._net = net
        self._src = src
        #: (region, shard) -> its node that leads the shard while the region does (None: the
        #: control shard's); None while that node is down or paused
        self._node_of = node_of
        self._model_revision = model_revision

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        region = (request.url.host or "").split(".")[0]
        timeouts = request.extensions.get("timeout") or {}
        timeout_s = timeouts.get("read") or DEFAULT_TIMEOUT_S
        try:
            return await asyncio.wait_for(self._exchange(region, request), timeout_s)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"{region} did not answer", request=request) from exc

    async def _exchange(self, region: str, request: httpx.Request) -> httpx.Response:
        net = self._net
        await asyncio.sleep(net.rng.uniform(net.faults.delay_min_s, net.faults.delay_max_s))
        node = self._node_of(region, _canary_shard(self._node_of(region, None), request))
        frozen = self._src in net.frozen or region in net.frozen
        if node is None or frozen or not net.reachable(self._src, region):
            raise httpx.ConnectError(f"{region} unreachable from {self._src}", request=request)
        try:
            response = await self._serve(node, region, request)
        except ConvplaneError as exc:
            response = httpx.Response(exc.http_status, json={"error": {"code": exc.code}})
        await asyncio.sleep(net.rng.uniform(net.faults.delay_min_s, net.faults.delay_max_s))
        if not net.reachable(region, self._src) or self._src in net.frozen:
            raise httpx.ReadError(f"the reply from {region} was lost", request=request)
        return response

    async def _serve(self, node: LogNode, region: str, request: httpx.Request) -> httpx.Response:
        path, params = request.url.path, request.url.params
        if path == CANARY_PATH and request.method == "POST":
            body = json.loads(request.content)
            await append_canary(
                node,
                self._model_revision,
                body["conversation_id"],
                body["idempotency_key"],
                body["payload"],
            )
            return httpx.Response(200, json={"served_by": region})
        if path == CANARY_PATH:
            events = await read_canary(
                node, params["conversation_id"], int(params.get("after_seq", "0"))
            )
            return httpx.Response(200, json={"events": events})
        if path == LOAD_PATH:
            return httpx.Response(200, json={"append_rate_per_s": 0.0})
        return httpx.Response(404, json={"error": {"code": "not_found"}})


def _canary_shard(node: LogNode | None, request: httpx.Request) -> int | None:
    """The shard of the canary conversation ``request`` writes or reads (None: not a canary
    call, or no node to ask)."""
    if node is None or request.url.path != CANARY_PATH:
        return None
    if request.method == "POST":
        conversation_id = json.loads(request.content)["conversation_id"]
    else:
        conversation_id = request.url.params["conversation_id"]
    return node.shard_of(str(conversation_id))

"""What a drill's preflight and dry run measure: the plane's live append rate, and the active
conversations (and their tokens) on the shards a drill would move."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping

import httpx

from eventlog.aio import bounded
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError
from eventlog.replica import ReplicaStore
from regions.drill_plan import MovedLoad
from services.drill_canary import DRILL_TENANT

#: the load meter's window, and the most appends it remembers
LOAD_WINDOW_S = 10.0
LOAD_SAMPLES_MAX = 1_000_000
#: one peer or replica call of the preflight
PREFLIGHT_CALL_TIMEOUT_S = 1.0
#: conversations listed per shard for the dry run
PLAN_CONVERSATIONS_PER_SHARD_MAX = 1000
LOAD_PATH = "/peer/drills/load"


class LoadMeter:
    """Acknowledged appends of the shards this node leads, per second over a sliding window
    (a ``LogListener``: the node calls it for every acknowledged conversation event)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._times: deque[float] = deque(maxlen=LOAD_SAMPLES_MAX)

    def shard_led(self, shard: int, epoch: int, previous_region: str | None) -> None:
        return None

    def conversation_written(self, tenant_id: str, conversation_id: str, event_type: str) -> None:
        if tenant_id != DRILL_TENANT:  # the drill's own canaries are not load
            self._times.append(self._clock.monotonic())

    def append_rate_per_s(self) -> float:
        cutoff = self._clock.monotonic() - LOAD_WINDOW_S
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
        return len(self._times) / LOAD_WINDOW_S


async def plane_append_rate_per_s(
    peers: httpx.AsyncClient,
    peer_urls: Mapping[str, str],
    region: str,
    headers: Mapping[str, str],
    own: LoadMeter,
) -> float:
    """This node's rate plus every peer's (``GET /peer/drills/load``); a peer that does not
    answer adds nothing (preflight refuses a plane with a region down anyway)."""
    others = [r for r in peer_urls if r != region]
    replies = await asyncio.gather(
        *(
            peers.get(
                peer_urls[r].rstrip("/") + LOAD_PATH,
                headers=dict(headers),
                timeout=PREFLIGHT_CALL_TIMEOUT_S,
            )
            for r in others
        ),
        return_exceptions=True,
    )
    total = own.append_rate_per_s()
    for reply in replies:
        if isinstance(reply, httpx.Response) and reply.status_code == 200:
            total += float(reply.json().get("append_rate_per_s", 0.0))
    return total


async def moved_load(
    store: ReplicaStore | None, shards: list[int], *, since_ms: int
) -> MovedLoad | None:
    """Active conversations (since ``since_ms``) on ``shards`` and their tokens, from this
    region's replica; None when it cannot tell."""
    if store is None or not shards:
        return None
    conversations = tokens = 0
    try:
        for shard in shards:
            status = await bounded(store.status(shard), PREFLIGHT_CALL_TIMEOUT_S)
            found = await bounded(
                store.list_conversations(
                    shard, since_ms, status.commit_lsn, PLAN_CONVERSATIONS_PER_SHARD_MAX
                ),
                PREFLIGHT_CALL_TIMEOUT_S,
            )
            for c in found:
                if c.tenant_id != DRILL_TENANT:
                    conversations += 1
                    tokens += c.token_count
    except (ConvplaneError, TimeoutError, OSError):
        return None
    return MovedLoad(conversations, tokens)

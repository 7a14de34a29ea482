"""What a drill's preflight and dry run measure: the plane's live append rate, and the active
conversations (and their tokens) on the shards a drill would move."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from eventlog.aio import bounded
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError
from eventlog.replica import ReplicaStore
from regions.drill_plan import MovedLoad
from regions.drills import DRILL_TENANT, ReplayTally
from services.control.region_nodes import PeerUrlOf

#: the load meter's window, and the most appends it remembers
LOAD_WINDOW_S = 10.0
LOAD_SAMPLES_MAX = 1_000_000
#: one peer or replica call of the preflight
PREFLIGHT_CALL_TIMEOUT_S = 1.0
#: conversations listed per shard for the dry run
PLAN_CONVERSATIONS_PER_SHARD_MAX = 1000
LOAD_PATH = "/peer/drills/load"


#: (succeeded, failed with a 5xx) per second of the live appends that entered this node
#: (``services.api.append_outcomes.AppendOutcomes``: client appends only, so never a canary)
EntryOutcomes = Callable[[], tuple[float, float]]


class LoadMeter:
    """Acknowledged appends of the shards this node leads, per second over a sliding window
    (a ``LogListener``: the node calls it for every acknowledged conversation event), and how
    the appends that entered this node ended (``entry_outcomes``, attached by the API's
    lifespan; none before it opens)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._times: deque[float] = deque(maxlen=LOAD_SAMPLES_MAX)
        self.entry_outcomes: EntryOutcomes | None = None

    def entry_rates(self) -> tuple[float, float]:
        return (0.0, 0.0) if self.entry_outcomes is None else self.entry_outcomes()

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


#: what a region's replay shows a drill (``ReplayService.drill_view``)
ReplayView = Callable[[], Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class PlaneLoad:
    """The plane's live load, as the nodes' own counters show it."""

    append_rate_per_s: float
    #: region -> its replay's view (only regions with engines that answered)
    replay: Mapping[str, Mapping[str, Any]]
    #: live appends, over every region that answered, by how they ended at their entry node
    live_succeeded_per_s: float = 0.0
    live_errors_per_s: float = 0.0

    def live_error_ratio(self) -> float | None:
        """5xx answers over ended live appends (None: none ended in the window)."""
        ended = self.live_succeeded_per_s + self.live_errors_per_s
        return self.live_errors_per_s / ended if ended > 0 else None

    def live_prefill_tokens_per_s(self) -> float | None:
        if not self.replay:
            return None
        return sum(float(v.get("live_tokens_per_s", 0.0)) for v in self.replay.values())

    def spare_prefill_tokens_per_s(self, excluding: str) -> float | None:
        """Spare prefill of the regions that would survive losing ``excluding``."""
        others = [v for r, v in self.replay.items() if r != excluding]
        if not others:
            return None
        return sum(float(v.get("spare_tokens_per_s", 0.0)) for v in others)

    def survivor_prefill_capacity_tokens_per_s(self, excluding: str) -> float | None:
        """The smallest survivor's prefill capacity: its live demand plus its spare."""
        others = [v for r, v in self.replay.items() if r != excluding]
        if not others:
            return None
        return min(
            float(v.get("live_tokens_per_s", 0.0)) + float(v.get("spare_tokens_per_s", 0.0))
            for v in others
        )

    def replay_tally(self) -> ReplayTally | None:
        if not self.replay:
            return None
        views = list(self.replay.values())
        last = [int(v["last_replayed_at_ms"]) for v in views if v.get("last_replayed_at_ms")]
        return ReplayTally(
            conversations_planned=sum(int(v.get("conversations_planned", 0)) for v in views),
            conversations_replayed=sum(int(v.get("conversations_replayed", 0)) for v in views),
            tokens_replayed=sum(int(v.get("tokens_replayed", 0)) for v in views),
            last_replayed_at_ms=max(last) if last else None,
        )


async def plane_load(
    peers: httpx.AsyncClient,
    peer_url: PeerUrlOf,
    regions: Collection[str],
    region: str,
    headers: Mapping[str, str],
    own: LoadMeter,
    own_replay: ReplayView | None,
) -> PlaneLoad:
    """This node's numbers plus those of each other region's node leading its control slot
    (``GET /peer/drills/load``); a peer that does not answer adds nothing (preflight refuses a
    plane with a region down anyway)."""
    others = [r for r in regions if r != region]
    replies = await asyncio.gather(
        *(
            peers.get(
                f"{peer_url(r, None)}".rstrip("/") + LOAD_PATH,
                headers=dict(headers),
                timeout=PREFLIGHT_CALL_TIMEOUT_S,
            )
            for r in others
        ),
        return_exceptions=True,
    )
    total = own.append_rate_per_s()
    succeeded, errors = own.entry_rates()
    replay: dict[str, Mapping[str, Any]] = {}
    own_view = None if own_replay is None else own_replay()
    if own_view is not None:
        replay[region] = own_view
    for peer, reply in zip(others, replies, strict=True):
        if isinstance(reply, httpx.Response) and reply.status_code == 200:
            body = reply.json()
            total += float(body.get("append_rate_per_s", 0.0))
            succeeded += float(body.get("live_succeeded_per_s", 0.0))
            errors += float(body.get("live_errors_per_s", 0.0))
            if isinstance(body.get("replay"), dict):
                replay[peer] = body["replay"]
    return PlaneLoad(total, replay, succeeded, errors)


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

"""Canary writes of a drill: one conversation per shard (moved or not), written in rounds for the
whole run, by the node that drives the drill.

Every ``CANARY_EVERY_S`` one canary event goes to every shard: in-process when this node leads
the shard, else to the region the committed placement names (``POST /peer/drills/canary``,
under a deadline). ``CanaryFleet`` runs one loop per shard (a slow shard does not delay
the others' measurements). A shard's canaries are numbered 1, 2, 3 ... and carry the idempotency key
``<drill>:<shard>:<n>``; a failed write is retried in the next round with the same key, so
after any failure (or a new control leader taking over with the persisted counts) every
acknowledged ``n`` stays unique and contiguous. RTO of a moved shard is the time from injection
to its first acknowledged canary served by another region than the target, or for a node kill
by another node than the killed one (or, for a loss or a kill whose failover outlasted the hold,
by the target once it is back); RPO is the count of acknowledged ``n`` not found when the
canary conversations are read back after the restore.

Writes go on while the drill restores (a failover still under way is measured), and stop once
the target is back, before the read-back.

The sliding window behind the guards counts only shards that should be serving: shards that do
not move, and moved shards once they recovered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from eventlog.aio import bounded
from eventlog.clock import Clock
from eventlog.conversations import ConversationLog
from eventlog.errors import InvalidRequest, InvariantViolation, NotFound
from eventlog.http_headers import PEER_AUTH_HEADER
from eventlog.node import LogNode
from eventlog.sharding import shard_of
from regions.drill_kinds import rules_of
from regions.drill_report import percentile
from regions.drills import DRILL_TENANT, SERIES_POINTS_MAX, Drill, Measurements
from services.control.region_nodes import PeerUrlOf, node_target, target_region

log = logging.getLogger("convplane.drills")

CANARY_EVENT = "note"
#: each shard gets a canary write this often (one loop per shard)
CANARY_EVERY_S = 0.2
#: one canary write (in-process or to a peer), and one read-back page. A slow ack is not an
#: error (the ack p99 guard judges latency); one this late is
CANARY_TIMEOUT_S = 2.0
#: canary writes under way at once
CANARY_IN_FLIGHT_MAX = 16
#: the guards' sliding window, and the fewest samples in it to judge by
GUARD_WINDOW_S = 5.0
GUARD_SAMPLES_MIN = 20
#: one point of the report's series per this many seconds
SERIES_STEP_S = 1.0
READ_PAGE_MAX = 1000
#: the most canaries one shard may have acknowledged in one drill (bounds the read-back)
CANARY_PER_SHARD_MAX = 100_000

CanarySend = Callable[[str, str, str, dict[str, Any]], Awaitable[str]]
"""(region, conversation_id, idempotency_key, payload) -> the node that served it, as its probe
target (``services.control.region_nodes.node_target``: the region's name for its first node)."""
CanaryRead = Callable[[str, str, int], Awaitable[list[dict[str, Any]]]]
"""(region, conversation_id, after_seq) -> a page of committed events (dicts with seq, payload)."""


def served_elsewhere(drill: Drill, served_by: str) -> bool:
    """Whether the node that served a canary (``CanarySend``) is outside what the drill took
    away: another region's, or for a node kill another node of the region too."""
    if drill.spec.node is None:
        return target_region(served_by) != drill.spec.region
    return served_by != node_target(drill.spec.region, drill.spec.node)


def canary_conversation(drill_id: str, shard: int, shard_count: int) -> str:
    for i in range(1_000_000):
        cid = f"drill-{drill_id}-s{shard}-{i}"
        if shard_of(cid, shard_count) == shard:
            return cid
    raise AssertionError(f"no conversation id hashes to shard {shard}")  # 1e6 tries: a bug


@dataclass(slots=True)
class _Sample:
    at_ms: int
    ok: bool
    latency_ms: float
    counts: bool  # the shard should be serving (guard window)


class CanaryRunner:
    """The canary writes and read-back of one drill, driven by the control leader."""

    def __init__(
        self,
        *,
        drill: Drill,
        shard_count: int,
        send: CanarySend,
        read: CanaryRead,
        clock: Clock,
    ) -> None:
        self.drill_id = drill.drill_id
        self._send = send
        self._read = read
        self._clock = clock
        self._gate = asyncio.Semaphore(CANARY_IN_FLIGHT_MAX)
        m = drill.measurements
        self.conversations = {
            s: canary_conversation(drill.drill_id, s, shard_count) for s in range(shard_count)
        }
        self.acked: dict[int, int] = {s: m.canary_acked.get(s, 0) for s in range(shard_count)}
        self.rto_s: dict[int, float] = dict(m.rto_s)
        self.errors = m.canary_errors
        self.series: list[tuple[float, int, int, float]] = list(m.series)
        self._window: deque[_Sample] = deque()
        self._bucket: list[_Sample] = []
        self._bucket_start_ms: int | None = None
        self._origin_ms = drill.created_at_ms
        #: the driver's write loops run while this holds; cleared once the target is restored
        self.writing = True

    async def round(self, drill: Drill, owners: Mapping[int, str]) -> None:
        """One canary write per shard, concurrently; each under ``CANARY_TIMEOUT_S``."""
        await asyncio.gather(*(self.write(drill, s, owners[s]) for s in sorted(owners)))

    async def write(self, drill: Drill, shard: int, owner: str) -> None:
        """One canary write to ``shard`` (through ``owner``), retried by the next call."""
        n = self.acked[shard] + 1
        if n > CANARY_PER_SHARD_MAX:
            return
        key = f"{self.drill_id}:{shard}:{n}"
        payload = {"drill_id": self.drill_id, "shard": shard, "n": n}
        async with self._gate:
            started_s = self._clock.monotonic()
            try:
                served_by = await bounded(
                    self._send(owner, self.conversations[shard], key, payload), CANARY_TIMEOUT_S
                )
                ok = True
            except InvariantViolation:
                raise  # a bug: never swallowed
            except Exception as exc:  # any failure of a canary write is an error sample
                log.warning("drill %s canary shard %d via %s: %r", self.drill_id, shard, owner, exc)
                served_by, ok = None, False
        now_ms = self._clock.wall_ms()
        latency_ms = (self._clock.monotonic() - started_s) * 1000
        moved = shard in drill.measurements.shards_moved
        if ok:
            self.acked[shard] = n
            injected_at_ms = drill.injected_at_ms
            # writable again: served elsewhere, or (a loss or kill) by the target once it is
            # back, when the failover took longer than the hold
            back = drill.phase == "restoring" and rules_of(drill.spec.kind).fault != "placement"
            if (
                moved
                and shard not in self.rto_s
                and injected_at_ms is not None
                and served_by is not None
                and (served_elsewhere(drill, served_by) or back)
            ):
                self.rto_s[shard] = max(0.0, (now_ms - injected_at_ms) / 1000)
        else:
            self.errors += 1
        counts = not moved or shard in self.rto_s
        self._observe(_Sample(now_ms, ok, latency_ms, counts))

    def _observe(self, sample: _Sample) -> None:
        self._window.append(sample)
        cutoff_ms = sample.at_ms - int(GUARD_WINDOW_S * 1000)
        while self._window and self._window[0].at_ms < cutoff_ms:
            self._window.popleft()
        if self._bucket_start_ms is None:
            self._bucket_start_ms = sample.at_ms
        if sample.at_ms - self._bucket_start_ms >= SERIES_STEP_S * 1000:
            self._close_bucket()
            self._bucket_start_ms = sample.at_ms
        self._bucket.append(sample)

    def _close_bucket(self) -> None:
        if not self._bucket or self._bucket_start_ms is None:
            return
        acked = sum(1 for s in self._bucket if s.ok)
        p99 = percentile([s.latency_ms for s in self._bucket if s.ok], 0.99) or 0.0
        t_s = (self._bucket_start_ms - self._origin_ms) / 1000
        self.series.append((t_s, acked, len(self._bucket) - acked, p99))
        del self.series[:-SERIES_POINTS_MAX]
        self._bucket = []

    def window(self) -> tuple[float | None, float | None]:
        """(error ratio, ack p99 ms) over the guard window, None when too few samples."""
        judged = [s for s in self._window if s.counts]
        if len(judged) < GUARD_SAMPLES_MIN:
            return None, None
        errors = sum(1 for s in judged if not s.ok)
        p99 = percentile([s.latency_ms for s in judged if s.ok], 0.99)
        return errors / len(judged), p99

    def measurements(self, drill: Drill) -> Measurements:
        return replace(
            drill.measurements,
            rto_s=dict(self.rto_s),
            canary_acked={s: n for s, n in self.acked.items() if n > 0},
            canary_errors=self.errors,
            series=tuple(self.series),
        )

    async def read_back(self, owners: Mapping[int, str]) -> int:
        """Acknowledged canary events not found in their conversations (RPO, must be 0)."""
        lost = 0
        for shard, acked in sorted(self.acked.items()):
            if acked == 0:
                continue
            found: set[int] = set()
            after_seq = 0
            while True:
                page = await bounded(
                    self._read(owners[shard], self.conversations[shard], after_seq),
                    CANARY_TIMEOUT_S * 5,
                )
                for event in page:
                    n = event.get("payload", {}).get("n")
                    if isinstance(n, int):
                        found.add(n)
                if len(page) < READ_PAGE_MAX:
                    break
                after_seq = int(page[-1]["seq"])
            lost += sum(1 for n in range(1, acked + 1) if n not in found)
        return lost


async def append_canary(
    log_node: ConversationLog,
    model_revision: str,
    conversation_id: str,
    idempotency_key: str,
    payload: dict[str, Any],
) -> None:
    """Append one canary event in-process, creating the canary conversation on first use."""
    try:
        await log_node.append_event(
            DRILL_TENANT, conversation_id, CANARY_EVENT, payload, idempotency_key=idempotency_key
        )
    except NotFound:
        await log_node.create_conversation(DRILL_TENANT, conversation_id, model_revision, {})
        await log_node.append_event(
            DRILL_TENANT, conversation_id, CANARY_EVENT, payload, idempotency_key=idempotency_key
        )


async def read_canary(
    log_node: ConversationLog, conversation_id: str, after_seq: int
) -> list[dict[str, Any]]:
    events = await log_node.list_events(DRILL_TENANT, conversation_id, after_seq, READ_PAGE_MAX)
    return [{"seq": e.seq, "payload": e.payload} for e in events]


class CanaryFleet:
    """The canary writers of the drills this node drives: one ``CanaryRunner`` per drill, with
    one loop per shard writing a canary every ``CANARY_EVERY_S`` (in-process where this node
    leads the shard, else to the leading region's peer listener), until the drill restores its
    target or is gone."""

    def __init__(
        self,
        *,
        node: LogNode,
        owners: Callable[[], Mapping[int, str]],
        drill_of: Callable[[str], Drill | None],
        peers: httpx.AsyncClient,
        peer_url: PeerUrlOf,
        peer_secret: str | None,
        peer_call_timeout_s: float,
        model_revision: str,
        shard_count: int,
        clock: Clock,
        served_by: str,
    ) -> None:
        """``owners``: the committed placement's shard -> region; ``drill_of``: a drill's
        record as this node applied it (None once it is gone); ``served_by``: this node as a
        probe target (what its own canary writes say served them)."""
        self._served_by = served_by
        self._node = node
        self._owners = owners
        self._drill_of = drill_of
        self._peers = peers
        self._peer_url_of = peer_url  # read live: the node leading a shard may change
        self._peer_headers = {PEER_AUTH_HEADER: peer_secret} if peer_secret else {}
        self._peer_call_timeout_s = peer_call_timeout_s
        self._model_revision = model_revision
        self._shard_count = shard_count
        self._clock = clock
        self._runs: dict[str, tuple[CanaryRunner, asyncio.Task[None]]] = {}

    def runner(self, drill: Drill) -> CanaryRunner:
        """The drill's runner, its loops started on first use."""
        existing = self._runs.get(drill.drill_id)
        if existing is not None:  # its loops end at restoring; its numbers live on till the end
            return existing[0]
        runner = self.new_runner(drill)
        task = asyncio.create_task(self._rounds(runner), name=f"canary-{drill.drill_id}")
        self._runs[drill.drill_id] = (runner, task)
        return runner

    def new_runner(self, drill: Drill) -> CanaryRunner:
        """A runner of its own, no loops (preflight's first canaries)."""
        return CanaryRunner(
            drill=drill,
            shard_count=self._shard_count,
            send=self._send,
            read=self._read,
            clock=self._clock,
        )

    async def stop_writing(self, drill_id: str) -> None:
        """Stop a drill's canary writes (at restore: the read-back must see a final count)."""
        runner, task = self._runs[drill_id]
        runner.writing = False
        await bounded(asyncio.shield(task), CANARY_TIMEOUT_S + CANARY_EVERY_S + 1.0)

    def stop(self, keep: Collection[str]) -> None:
        """Cancel the runs of every drill not in ``keep``, and forget them."""
        for drill_id in [d for d in self._runs if d not in keep]:
            _, task = self._runs.pop(drill_id)
            task.cancel()

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for _, task in self._runs.values()]

    async def _rounds(self, runner: CanaryRunner) -> None:
        await asyncio.gather(*(self._shard(runner, s) for s in range(self._shard_count)))

    async def _shard(self, runner: CanaryRunner, shard: int) -> None:
        while runner.writing:
            drill = self._drill_of(runner.drill_id)
            if drill is None or not drill.active:
                return
            await runner.write(drill, shard, self._owners()[shard])
            await self._clock.sleep(CANARY_EVERY_S)

    async def _send(
        self, region: str, conversation_id: str, key: str, payload: dict[str, Any]
    ) -> str:
        shard = self._node.shard_of(conversation_id)
        if self._node.leads(shard):
            await append_canary(self._node, self._model_revision, conversation_id, key, payload)
            return self._served_by
        body = {"conversation_id": conversation_id, "idempotency_key": key, "payload": payload}
        reply = await self._peers.post(
            self._peer_url(region, shard, "/peer/drills/canary"),
            json=body,
            headers=self._peer_headers,
            timeout=self._peer_call_timeout_s,
        )
        if reply.status_code != 200:
            raise InvalidRequest(f"canary to {region}: {reply.status_code} {reply.text[:300]}")
        answer = reply.json()
        node = answer.get("node")  # a node of an earlier release names its region only
        return node_target(str(answer["served_by"]), node if type(node) is int else 0)

    async def _read(
        self, region: str, conversation_id: str, after_seq: int
    ) -> list[dict[str, Any]]:
        shard = self._node.shard_of(conversation_id)
        if self._node.leads(shard):
            return await read_canary(self._node, conversation_id, after_seq)
        reply = await self._peers.get(
            self._peer_url(region, shard, "/peer/drills/canary"),
            params={"conversation_id": conversation_id, "after_seq": after_seq},
            headers=self._peer_headers,
            timeout=self._peer_call_timeout_s * 5,
        )
        if reply.status_code == 404:
            return []
        if reply.status_code != 200:
            raise InvalidRequest(f"canary read from {region}: {reply.status_code}")
        events: list[dict[str, Any]] = reply.json()["events"]
        return events

    def _peer_url(self, region: str, shard: int, path: str) -> str:
        return f"{self._peer_url_of(region, shard)}".rstrip("/") + path

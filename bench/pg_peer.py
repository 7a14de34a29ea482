"""The peer every log benchmark compares against: PostgreSQL's own quorum synchronous
replication (a primary + 2 streaming standbys, ``synchronous_standby_names = 'ANY 1 (s1,
s2)'``, started by ``tests.harness.postgres.start_sync_replication_cluster``), and the closed-loop
driver and recorder the benchmarks share.

The peer's writers insert 1 KiB rows, one transaction per event (autocommit ``INSERT``),
through an asyncpg pool; a commit returns once one standby has flushed it. Used by
``bench/append.py`` (library path) and ``bench/rest.py`` (REST path).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import asyncpg

from bench.cpu import cpu_snapshot, cpu_used

TENANT = "bench"
LATENCY_SAMPLES_MAX = 5_000_000  # bounded recorder; a 2-minute run stays far below
CALL_TIMEOUT_S = 10.0  # every await on the peer's database


@dataclass
class Recorder:
    """Ack latencies of the events finished inside the measurement window."""

    window_start: float
    window_end: float
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    #: appends finished during the whole drive, warm-up included (what the CPU is divided by)
    completed: int = 0
    #: CPU seconds per 1,000 completed events, by process group (where ``drive`` was given any)
    cpu_s_per_1000_events: dict[str, float] = field(default_factory=dict)

    def record(self, started: float, finished: float) -> None:
        self.completed += 1
        if self.window_start <= finished <= self.window_end:
            if len(self.latencies_s) < LATENCY_SAMPLES_MAX:
                self.latencies_s.append(finished - started)

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    @property
    def events_per_s(self) -> float:
        return len(self.latencies_s) / (self.window_end - self.window_start)

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    writers: int,
    warmup_s: float,
    seconds: float,
    append: Callable[[int], Awaitable[None]],
    cpu_of: Mapping[str, int] | None = None,
) -> Recorder:
    """``writers`` closed-loop writers calling ``append(writer)`` until the window ends. With
    ``cpu_of`` (name -> root pid, e.g. a postmaster), the CPU of those process trees and of this
    process over the drive, per 1,000 completed events."""
    groups = dict(cpu_of or {})
    cpu_before = cpu_snapshot(groups)
    process_cpu_before_s = time.process_time()
    now = time.perf_counter()
    recorder = Recorder(now + warmup_s, now + warmup_s + seconds)

    async def writer(index: int) -> None:
        while (started := time.perf_counter()) < recorder.window_end:
            try:
                await append(index)
            except Exception as exc:  # counted and reported: a bench must not hide errors
                recorder.error(exc)
                await asyncio.sleep(0.01)
                continue
            recorder.record(started, time.perf_counter())

    await asyncio.gather(*(writer(i) for i in range(writers)))
    if cpu_of is not None:
        used = cpu_used(cpu_before, groups)
        used["bench process"] = time.process_time() - process_cpu_before_s
        events = max(recorder.completed, 1)
        recorder.cpu_s_per_1000_events = {k: round(1000 * v / events, 3) for k, v in used.items()}
    return recorder


def payload_text(payload_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(payload_bytes))


PEER_TABLE = """
CREATE TABLE IF NOT EXISTS events (
    conversation_id text NOT NULL,
    seq integer NOT NULL,
    tenant_id text NOT NULL,
    event_type text NOT NULL,
    body text NOT NULL,
    created_at_ms bigint NOT NULL,
    PRIMARY KEY (conversation_id, seq)
)
"""
PEER_LAST_SEQ = "SELECT max(seq) FROM events WHERE conversation_id = $1"
#: the first page of a conversation's transcript (the plane's ``GET .../events?limit=N``)
PEER_PAGE = (
    "SELECT seq, tenant_id, event_type, body, created_at_ms FROM events "
    "WHERE conversation_id = $1 ORDER BY seq LIMIT $2"
)
PEER_INSERT = (
    "INSERT INTO events (conversation_id, seq, tenant_id, event_type, body, created_at_ms) "
    "VALUES ($1, $2, $3, $4, $5, $6)"
)


async def run_peer_reads(
    dsn: str,
    *,
    readers: int,
    pool_max: int,
    warmup_s: float,
    seconds: float,
    page_events: int = 0,
    cpu_of: Mapping[str, int] | None = None,
) -> Recorder:
    """``readers`` closed-loop readers, each asking the primary at ``dsn`` for the last seq of
    the conversation ``run_peer``'s writer of its index wrote, or with ``page_events`` for its
    first ``page_events`` events (the primary is the one place a read sees every acknowledged
    write: the peer's linearizable read); ``cpu_of`` as ``drive``'s. Its ``events_per_s`` are
    reads."""
    async with peer_pool(dsn, min(readers, pool_max)) as pool:

        async def read(index: int) -> None:
            conversation_id = f"bench-{index}"
            if page_events:
                await pool.fetch(PEER_PAGE, conversation_id, page_events, timeout=CALL_TIMEOUT_S)
            else:
                await pool.fetchval(PEER_LAST_SEQ, conversation_id, timeout=CALL_TIMEOUT_S)

        return await drive(readers, warmup_s, seconds, read, cpu_of)


@asynccontextmanager
async def peer_pool(dsn: str, size: int) -> AsyncIterator[asyncpg.Pool]:
    """A pool of ``size`` connections to the peer's primary at ``dsn``, closed after."""
    pool = await asyncpg.create_pool(
        plain_dsn(dsn), min_size=size, max_size=size, timeout=CALL_TIMEOUT_S
    )
    try:
        yield pool
    finally:
        await asyncio.wait_for(pool.close(), CALL_TIMEOUT_S)


def plain_dsn(dsn: str) -> str:
    return dsn.replace("postgresql+asyncpg://", "postgresql://", 1)


async def run_peer(
    dsn: str,
    *,
    writers: int,
    pool_max: int,
    payload_bytes: int,
    seed: int,
    warmup_s: float,
    seconds: float,
    cpu_of: Mapping[str, int] | None = None,
) -> Recorder:
    """``writers`` closed-loop writers, one conversation each, inserting ``payload_bytes``
    messages into the sync-replication primary at ``dsn`` (a pool of ``pool_max`` at most);
    ``cpu_of`` as ``drive``'s."""
    async with peer_pool(dsn, min(writers, pool_max)) as pool:
        await pool.execute(PEER_TABLE, timeout=CALL_TIMEOUT_S)
        # a second run on the same cluster starts past the first run's rows
        first_seq = await pool.fetchval(
            "SELECT coalesce(max(seq), 0) FROM events", timeout=CALL_TIMEOUT_S
        )
        body = json.dumps({"content": payload_text(payload_bytes, seed)})
        seqs = [int(first_seq)] * writers

        async def append(index: int) -> None:
            seqs[index] += 1
            await pool.execute(
                PEER_INSERT, f"bench-{index}", seqs[index], TENANT, "message.user", body,
                time.time_ns() // 1_000_000, timeout=CALL_TIMEOUT_S,
            )  # fmt: skip

        return await drive(writers, warmup_s, seconds, append, cpu_of)

"""Replica calls timed for Prometheus and traced: a ``ReplicaStore`` that wraps another,
observes how long each protocol call (prepare, append, status) took, by the replica's region
and the call, and makes a span for an append that carries a traced request's entries.

``open_runtime`` builds the stores before the app exists, so the instruments are set late:
the histogram is built unregistered and the app registers it next to its own series; the app
sets ``tracing`` when tracing is on (``services.tracing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import Histogram

from eventlog.clock import Clock
from eventlog.identity import IdentityRecord
from eventlog.model import AppendReply, ConversationSummary, LogEntry, PrepareReply, ShardStatus
from eventlog.replica import ReplicaStore
from services.tracing import NodeTracing

#: a durable commit on a local disk is ~1 ms; a remote region's round trip tens to hundreds
REPLICA_CALL_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


def replica_call_histogram() -> Histogram:
    return Histogram(
        "convplane_replica_call_duration_seconds",
        "time of one protocol call from this node to a region's replica store (answered or "
        "failed), by the replica's region and the call",
        ["region", "call"],
        buckets=REPLICA_CALL_BUCKETS_S,
        registry=None,
    )


@dataclass
class ReplicaInstruments:
    histogram: Histogram
    tracing: NodeTracing | None = None


class TimedReplica(ReplicaStore):
    """Observes ``prepare``, ``append`` and ``status``; passes every other call through."""

    def __init__(self, inner: ReplicaStore, instruments: ReplicaInstruments, clock: Clock) -> None:
        self.region = inner.region
        self._inner = inner
        self._instruments = instruments
        self._clock = clock
        histogram = instruments.histogram
        # children resolved once: observing is then one bucket increment
        self._prepare = histogram.labels(inner.region, "prepare")
        self._append = histogram.labels(inner.region, "append")
        self._status = histogram.labels(inner.region, "status")

    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply:
        started_s = self._clock.monotonic()
        try:
            return await self._inner.prepare(shard, epoch, tail_max)
        finally:
            self._prepare.observe(self._clock.monotonic() - started_s)

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
    ) -> AppendReply:
        tracing = self._instruments.tracing
        if tracing is not None:
            with tracing.replica_span("append", self.region, shard, entries):
                return await self._timed_append(
                    shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn
                )
        return await self._timed_append(
            shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn
        )

    async def _timed_append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
    ) -> AppendReply:
        started_s = self._clock.monotonic()
        try:
            return await self._inner.append(
                shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn
            )
        finally:
            self._append.observe(self._clock.monotonic() - started_s)

    async def status(self, shard: int) -> ShardStatus:
        started_s = self._clock.monotonic()
        try:
            return await self._inner.status(shard)
        finally:
            self._status.observe(self._clock.monotonic() - started_s)

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        return await self._inner.read_log(shard, after_lsn, limit)

    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        return await self._inner.read_conversation(
            shard, tenant_id, conversation_id, after_seq, limit, max_lsn
        )

    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        return await self._inner.list_conversations(shard, active_since_ms, max_lsn, limit)

    async def identity(self) -> str:
        return await self._inner.identity()

    async def registry(self) -> dict[str, IdentityRecord]:
        return await self._inner.registry()

    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        await self._inner.record_identity(region, record)


def timed_replicas(
    replicas: Mapping[str, ReplicaStore], instruments: ReplicaInstruments, clock: Clock
) -> dict[str, ReplicaStore]:
    return {region: TimedReplica(store, instruments, clock) for region, store in replicas.items()}

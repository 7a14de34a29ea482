"""Replica calls timed for Prometheus and traced: a ``ReplicaStore`` that wraps another,
observes how long each protocol call (prepare, append, status) took, by the replica's region
and the call, and makes a span for an append that carries a traced request's entries.

``open_runtime`` builds the stores before the app exists, so the instruments are set late:
the histogram is built unregistered and the app registers it next to its own series; the app
sets ``tracing`` when tracing is on (``services.tracing``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Histogram

from eventlog.clock import Clock
from eventlog.model import AppendReply, HeldPosition, LogEntry
from eventlog.replica import ReplicaStore, ReplicaStoreWrapper
from services.tracing import NodeTracing

#: a durable commit on a local disk is ~1 ms; a remote region's round trip tens to hundreds
T = TypeVar("T")


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


class TimedReplica(ReplicaStoreWrapper):
    """Observes ``prepare``, ``append`` and ``status`` (and traces ``append``); passes every
    other call through."""

    def __init__(self, inner: ReplicaStore, instruments: ReplicaInstruments, clock: Clock) -> None:
        super().__init__(inner)
        self._instruments = instruments
        self._clock = clock
        histogram = instruments.histogram
        # children resolved once: observing is then one bucket increment
        self._timed = {
            call: histogram.labels(inner.region, call) for call in ("prepare", "append", "status")
        }

    async def around(self, call: str, read_only: bool, thunk: Callable[[], Awaitable[T]]) -> T:
        child = self._timed.get(call)
        if child is None:
            return await thunk()
        started_s = self._clock.monotonic()
        try:
            return await thunk()
        finally:
            child.observe(self._clock.monotonic() - started_s)

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply:
        tracing = self._instruments.tracing
        call = super().append(
            shard,
            epoch,
            prev_lsn,
            prev_epoch,
            entries,
            leader_commit_lsn,
            expected_store_id,
            positions,
        )
        if tracing is None:
            return await call
        with tracing.replica_span("append", self.region, shard, entries):
            return await call


def timed_replicas(
    replicas: Mapping[str, ReplicaStore], instruments: ReplicaInstruments, clock: Clock
) -> dict[str, ReplicaStore]:
    return {region: TimedReplica(store, instruments, clock) for region, store in replicas.items()}

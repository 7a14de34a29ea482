"""Which offset a consumer may commit: never past a job that is not finished. Pure, no I/O.

Kafka commits one number per partition: "everything before this offset is done". Jobs of one
partition finish out of order (a worker runs several at once), so the committable offset is
the smallest offset still in flight, or one past the last delivered offset when nothing is in
flight. Offsets are not assumed contiguous (compaction and transaction markers leave gaps):
only offsets actually delivered count.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from eventlog.errors import InvariantViolation

P = TypeVar("P", bound=Hashable)


@dataclass
class _PartitionState:
    in_flight: set[int] = field(default_factory=set)
    last_delivered: int = -1
    committed: int = -1  # the offset last handed out for commit (next offset to consume)
    generation: int = 0  # changes when the partition is forgotten and delivered again


class OffsetTracker(Generic[P]):
    """Per partition: offsets delivered and not yet finished, and the commit position."""

    def __init__(self, in_flight_max: int) -> None:
        self._in_flight_max = in_flight_max
        self._partitions: dict[P, _PartitionState] = {}
        self._generations = 0

    def in_flight_count(self) -> int:
        return sum(len(s.in_flight) for s in self._partitions.values())

    def delivered(self, partition: P, offset: int) -> int:
        """Track a delivered offset; return the generation to pass back to ``finished``."""
        state = self._partitions.get(partition)
        if state is None:
            self._generations += 1
            # The group's committed position is at most this first offset: nothing to commit yet.
            state = self._partitions[partition] = _PartitionState(
                committed=offset, generation=self._generations
            )
        if offset <= state.last_delivered:
            # The consumer was rewound (rebalance, seek) without forget(): a bug in the adapter.
            raise InvariantViolation(
                f"offset {offset} delivered after {state.last_delivered} on {partition!r}"
            )
        if self.in_flight_count() >= self._in_flight_max:
            raise InvariantViolation(f"more than {self._in_flight_max} jobs in flight")
        state.in_flight.add(offset)
        state.last_delivered = offset
        return state.generation

    def finished(self, partition: P, offset: int, generation: int) -> int | None:
        """Mark a job done; return the offset to commit now, or None if it did not advance.

        Finishing an offset of a partition this tracker forgot since (revoked in a rebalance)
        returns None: the partition's owner redelivers it, which replay tolerates (idempotent).
        """
        state = self._partitions.get(partition)
        if state is None or state.generation != generation or offset not in state.in_flight:
            return None
        state.in_flight.discard(offset)
        position = min(state.in_flight) if state.in_flight else state.last_delivered + 1
        if position <= state.committed:
            return None
        state.committed = position
        return position

    def committable(self, partition: P) -> int | None:
        state = self._partitions.get(partition)
        if state is None or state.last_delivered < 0:
            return None
        return min(state.in_flight) if state.in_flight else state.last_delivered + 1

    def forget(self, partition: P) -> set[int]:
        """Drop a partition (revoked); return its offsets that were still in flight."""
        state = self._partitions.pop(partition, None)
        return set() if state is None else set(state.in_flight)

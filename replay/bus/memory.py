"""The embedded job bus: bounded in-process queues with the Kafka adapter's delivery semantics.

One queue per region and one worker group per region (every consumer of a region shares its
jobs). A job delivered to a consumer is held by that consumer until ``finish``; when the consumer
closes (or its owner is cancelled and closes it), its unfinished jobs go back to the front of the
queue, in their original order, for the other consumers. Results go to one bounded buffer read
by ``result_stream`` readers; when nobody reads, the oldest results are dropped and counted
(results are hints for the router's KV affinity, not part of the replay's correctness).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Sequence

from eventlog.errors import InvariantViolation
from replay.bus.port import (
    JobBus,
    JobBusFull,
    JobBusUnavailable,
    JobConsumer,
    JobDelivery,
    ResultStream,
)
from replay.model import ReplayJob, ReplayResult


class _RegionQueue:
    def __init__(self, jobs_max: int) -> None:
        self.jobs_max = jobs_max
        self.pending: deque[tuple[int, ReplayJob]] = deque()
        self.changed = asyncio.Condition()
        self.offsets = itertools.count()

    async def put(self, jobs: Sequence[ReplayJob], timeout_s: float) -> None:
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: len(self.pending) + len(jobs) <= self.jobs_max),
                    timeout_s,
                )
            except TimeoutError as exc:
                raise JobBusFull(f"replay job queue full ({self.jobs_max} jobs)") from exc
            self.pending.extend((next(self.offsets), job) for job in jobs)
            self.changed.notify_all()

    async def take(self, timeout_s: float) -> tuple[int, ReplayJob] | None:
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait_for(lambda: bool(self.pending)), timeout_s)
            if not self.pending:
                return None
            item = self.pending.popleft()
            self.changed.notify_all()  # a publisher may be waiting for room
            return item

    def give_back(self, items: list[tuple[int, ReplayJob]]) -> None:
        # Redelivered jobs skip the size bound: they were inside it when first published.
        self.pending.extendleft(reversed(sorted(items, key=lambda item: item[0])))


class InProcessJobConsumer(JobConsumer):
    def __init__(self, region: str, queue: _RegionQueue, in_flight_max: int, ident: int) -> None:
        self.region = region
        self._queue = queue
        self._in_flight_max = in_flight_max
        self._ident = ident
        self._in_flight: dict[int, ReplayJob] = {}
        self._state = "new"

    async def start(self) -> None:
        self._state = "started"

    async def next_job(self, timeout_s: float) -> JobDelivery | None:
        if self._state != "started":
            raise JobBusUnavailable(f"job consumer is {self._state}")
        if len(self._in_flight) >= self._in_flight_max:
            raise InvariantViolation(f"more than {self._in_flight_max} jobs in flight")
        item = await self._queue.take(timeout_s)
        if item is None:
            return None
        if self._state != "started":  # closed while waiting: the job is not ours to run
            self._queue.give_back([item])
            return None
        offset, job = item
        self._in_flight[offset] = job
        return JobDelivery(job=job, partition=0, offset=offset, generation=self._ident)

    async def finish(self, delivery: JobDelivery) -> None:
        if delivery.generation == self._ident:
            self._in_flight.pop(delivery.offset, None)

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        items = list(self._in_flight.items())
        self._in_flight.clear()
        async with self._queue.changed:
            self._queue.give_back(items)
            self._queue.changed.notify_all()


class InProcessResultStream(ResultStream):
    def __init__(self, bus: InProcessJobBus) -> None:
        self._bus = bus

    async def start(self) -> None:
        return None

    async def next_result(self, timeout_s: float) -> ReplayResult | None:
        return await self._bus.take_result(timeout_s)

    async def close(self) -> None:
        return None


class InProcessJobBus(JobBus):
    def __init__(
        self,
        *,
        jobs_max_per_region: int = 10_000,
        results_max: int = 10_000,
        publish_timeout_s: float = 5.0,
    ) -> None:
        self._jobs_max_per_region = jobs_max_per_region
        self._publish_timeout_s = publish_timeout_s
        self._regions: dict[str, _RegionQueue] = {}
        self._results: deque[ReplayResult] = deque(maxlen=results_max)
        self._results_changed: asyncio.Condition | None = None
        self._consumer_ids = itertools.count(1)
        self.results_dropped = 0

    def _region(self, region: str) -> _RegionQueue:
        queue = self._regions.get(region)
        if queue is None:
            queue = self._regions[region] = _RegionQueue(self._jobs_max_per_region)
        return queue

    def pending_count(self, region: str) -> int:
        return len(self._region(region).pending)

    async def start(self) -> None:
        self._results_changed = asyncio.Condition()

    async def close(self) -> None:
        return None

    async def publish_jobs(self, jobs: Sequence[ReplayJob]) -> None:
        by_region: dict[str, list[ReplayJob]] = {}
        for job in jobs:
            by_region.setdefault(job.region, []).append(job)
        for region, region_jobs in by_region.items():
            await self._region(region).put(region_jobs, self._publish_timeout_s)

    async def publish_result(self, result: ReplayResult) -> None:
        changed = self._changed()
        async with changed:
            if len(self._results) == self._results.maxlen:
                self.results_dropped += 1
            self._results.append(result)
            changed.notify_all()

    async def take_result(self, timeout_s: float) -> ReplayResult | None:
        changed = self._changed()
        async with changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait_for(lambda: bool(self._results)), timeout_s)
            return self._results.popleft() if self._results else None

    def job_consumer(self, region: str, *, in_flight_max: int) -> JobConsumer:
        return InProcessJobConsumer(
            region, self._region(region), in_flight_max, next(self._consumer_ids)
        )

    def result_stream(self, *, group_id: str | None = None) -> ResultStream:
        return InProcessResultStream(self)

    def _changed(self) -> asyncio.Condition:
        if self._results_changed is None:
            raise JobBusUnavailable("InProcessJobBus used before start()")
        return self._results_changed

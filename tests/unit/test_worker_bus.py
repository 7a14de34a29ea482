"""The in-process job bus, the offset tracker and the wire format of the job bus."""

from __future__ import annotations

import pytest

from eventlog.errors import InvariantViolation
from replay.bus import InProcessJobBus, JobBusFull, MalformedMessage
from replay.bus.offsets import OffsetTracker
from replay.bus.port import decode_job, decode_result, encode_job, encode_result
from replay.model import ReplayJob, ReplayResult


def job(n: int, region: str = "eu") -> ReplayJob:
    return ReplayJob(f"j{n}", region, "t1", f"c{n}", "rev-a", 100, 0, 10**13, 3)


def result(n: int) -> ReplayResult:
    return ReplayResult(
        f"j{n}", "eu", "t1", f"c{n}", "rev-a", "replayed", "w1", "e1", 10, 2, 1.5, 5
    )


# --- InProcessJobBus --------------------------------------------------------------------------


async def test_jobs_are_shared_by_the_region_group_in_order() -> None:
    async with InProcessJobBus() as bus:
        await bus.publish_jobs([job(1), job(2), job(3, region="us")])
        async with (
            bus.job_consumer("eu", in_flight_max=4) as a,
            bus.job_consumer("eu", in_flight_max=4) as b,
        ):
            first, second = await a.next_job(0.01), await b.next_job(0.01)
            assert first is not None and second is not None
            assert (first.job.job_id, second.job.job_id) == ("j1", "j2")
            assert await a.next_job(0.01) is None  # "us" jobs are not the eu group's
            await a.finish(first)
            await b.finish(second)
        assert bus.pending_count("eu") == 0 and bus.pending_count("us") == 1


async def test_unfinished_jobs_of_a_closed_consumer_are_redelivered_first_in_order() -> None:
    async with InProcessJobBus() as bus:
        await bus.publish_jobs([job(n) for n in range(1, 5)])
        crashed = bus.job_consumer("eu", in_flight_max=4)
        await crashed.start()
        taken = [await crashed.next_job(0.01) for _ in range(3)]
        assert all(d is not None for d in taken)
        await crashed.finish(taken[1])  # j2 done; j1 and j3 not
        await crashed.close()

        async with bus.job_consumer("eu", in_flight_max=4) as survivor:
            ids = []
            while (delivery := await survivor.next_job(0.01)) is not None:
                ids.append(delivery.job.job_id)
                await survivor.finish(delivery)
        assert ids == ["j1", "j3", "j4"]


async def test_finish_from_a_closed_consumer_does_not_drop_the_redelivered_job() -> None:
    async with InProcessJobBus() as bus:
        await bus.publish_jobs([job(1)])
        first = bus.job_consumer("eu", in_flight_max=1)
        await first.start()
        stale = await first.next_job(0.01)
        assert stale is not None
        await first.close()
        async with bus.job_consumer("eu", in_flight_max=1) as second:
            fresh = await second.next_job(0.01)
            assert fresh is not None and fresh.job == stale.job
            await first.finish(stale)  # a late finish from the dead consumer changes nothing
            await second.close()
        assert bus.pending_count("eu") == 1


async def test_publish_into_a_full_queue_fails_after_the_timeout() -> None:
    async with InProcessJobBus(jobs_max_per_region=2, publish_timeout_s=0.01) as bus:
        await bus.publish_jobs([job(1), job(2)])
        with pytest.raises(JobBusFull):
            await bus.publish_jobs([job(3)])
        assert bus.pending_count("eu") == 2


async def test_results_buffer_drops_the_oldest_when_nobody_reads() -> None:
    async with InProcessJobBus(results_max=2) as bus:
        for n in range(1, 4):
            await bus.publish_result(result(n))
        stream = bus.result_stream()
        got = [await stream.next_result(0.01) for _ in range(3)]
        assert [r.job_id if r else None for r in got] == ["j2", "j3", None]
        assert bus.results_dropped == 1


# --- OffsetTracker ----------------------------------------------------------------------------


def test_commit_never_passes_an_unfinished_offset() -> None:
    tracker: OffsetTracker[int] = OffsetTracker(in_flight_max=10)
    gens = {offset: tracker.delivered(0, offset) for offset in (5, 6, 7, 9)}  # 8 is a gap
    assert tracker.finished(0, 7, gens[7]) is None  # 5 still running
    assert tracker.finished(0, 6, gens[6]) is None
    assert tracker.finished(0, 5, gens[5]) == 9  # 5..7 done, 9 running
    assert tracker.finished(0, 9, gens[9]) == 10
    assert tracker.committable(0) == 10


def test_partitions_are_independent() -> None:
    tracker: OffsetTracker[str] = OffsetTracker(in_flight_max=10)
    ga, gb = tracker.delivered("a", 0), tracker.delivered("b", 0)
    tracker.delivered("a", 1)
    assert tracker.finished("b", 0, gb) == 1
    assert tracker.finished("a", 0, ga) == 1


def test_a_forgotten_partition_ignores_late_finishes() -> None:
    tracker: OffsetTracker[int] = OffsetTracker(in_flight_max=10)
    old = tracker.delivered(0, 3)
    assert tracker.forget(0) == {3}
    new = tracker.delivered(0, 3)  # redelivered after a rebalance
    assert tracker.finished(0, 3, old) is None
    assert tracker.committable(0) == 3
    assert tracker.finished(0, 3, new) == 4


def test_rewinding_without_forget_or_overfilling_is_a_bug() -> None:
    tracker: OffsetTracker[int] = OffsetTracker(in_flight_max=1)
    tracker.delivered(0, 3)
    with pytest.raises(InvariantViolation):
        tracker.delivered(0, 3)
    with pytest.raises(InvariantViolation):
        tracker.delivered(1, 0)


# --- wire format ------------------------------------------------------------------------------


def test_jobs_and_results_round_trip() -> None:
    assert decode_job(encode_job(job(1))) == job(1)
    assert decode_result(encode_result(result(1))) == result(1)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"job_id": "x"}',
        None,
        encode_job(job(1)).replace(b'"through_seq":3', b'"through_seq":"3"'),
    ],
)
def test_malformed_jobs_are_typed_errors(raw: bytes | None) -> None:
    with pytest.raises(MalformedMessage):
        decode_job(raw)


def test_unknown_result_status_is_malformed() -> None:
    with pytest.raises(MalformedMessage):
        decode_result(encode_result(result(1)).replace(b'"replayed"', b'"maybe"'))

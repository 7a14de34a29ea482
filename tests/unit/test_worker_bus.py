"""The in-process job bus, the offset tracker and the signed wire format of the job bus."""

from __future__ import annotations

import dataclasses
import json

import pytest

from eventlog.errors import InvariantViolation
from replay.bus import InProcessJobBus, JobBusFull, MalformedMessage
from replay.bus.codec import BusCodec, ForeignRegionRecord
from replay.bus.offsets import OffsetTracker
from replay.bus.port import UnauthenticatedMessage
from replay.model import RESULT_REQUESTS_MAX, ReplayJob, ReplayResult


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
        assert taken[1] is not None and all(d is not None for d in taken)
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


# --- wire format: signed envelopes, every field checked ----------------------------------------

EU_KEY, US_KEY = bytes(range(32)), bytes(range(1, 33))
CODEC = BusCodec({"eu": EU_KEY, "us": US_KEY})


def test_jobs_and_results_round_trip() -> None:
    assert CODEC.decode_job(CODEC.encode_job(job(1)), "eu") == job(1)
    assert CODEC.decode_result(CODEC.encode_result(result(1))) == result(1)
    pieces = dataclasses.replace(result(1), request_ms=(3.0, 4.5), queried_tokens=30,
                                 hit_tokens=16)  # fmt: skip
    assert CODEC.decode_result(CODEC.encode_result(pieces)) == pieces


def test_a_result_from_a_worker_before_engine_requests_were_reported_reads() -> None:
    body = dataclasses.asdict(result(1))
    for name in ("request_ms", "queried_tokens", "hit_tokens"):
        del body[name]
    signed = BusCodec({"eu": EU_KEY})._encode("result", "eu", body)
    assert CODEC.decode_result(signed) == result(1)


def _forge(envelope_bytes: bytes, **body_changes: object) -> bytes:
    envelope = json.loads(envelope_bytes)
    envelope["body"].update(body_changes)
    return json.dumps(envelope).encode()


@pytest.mark.parametrize(
    "raw",
    [
        # tampered: another tenant's conversation, same MAC
        _forge(CODEC.encode_job(job(1)), tenant_id="t2"),
        _forge(CODEC.encode_job(job(1)), through_seq=99),
        # forged: signed with a key that is not the region's
        BusCodec({"eu": bytes(32)}).encode_job(job(1)),
        # a plain, unsigned job as the bus carried them before
        json.dumps(dataclasses.asdict(job(1))).encode(),
        # a job signed for the us region, put on eu's topic
        CODEC.encode_job(job(1, region="us")),
    ],
)
def test_forged_or_tampered_jobs_are_rejected(raw: bytes) -> None:
    with pytest.raises(UnauthenticatedMessage):
        CODEC.decode_job(raw, "eu")


def test_a_worker_holding_one_region_key_cannot_sign_for_another() -> None:
    eu_worker = BusCodec({"eu": EU_KEY})
    with pytest.raises(InvariantViolation):
        eu_worker.encode_job(job(1, region="us"))
    with pytest.raises(ForeignRegionRecord):  # a us result it cannot check: skipped, quietly
        eu_worker.decode_result(CODEC.encode_result(dataclasses.replace(result(1), region="us")))
    with pytest.raises(UnauthenticatedMessage):  # a job of us on eu's topic: rejected
        eu_worker.decode_job(CODEC.encode_job(job(1, region="us")), "eu")


@pytest.mark.parametrize(
    "bad",
    [
        {"through_seq": "3"},
        {"through_seq": 0},
        {"estimated_prompt_tokens": -1},
        {"deadline_ms": 2**60},
        {"conversation_id": "../../v1/admin"},
        {"tenant_id": ""},
        {"model_revision": "has space"},
    ],
)
def test_signed_jobs_with_bad_fields_are_malformed(bad: dict[str, object]) -> None:
    signed = BusCodec({"eu": EU_KEY})._encode("job", "eu", {**dataclasses.asdict(job(1)), **bad})
    with pytest.raises(MalformedMessage) as caught:
        CODEC.decode_job(signed, "eu")
    assert not isinstance(caught.value, UnauthenticatedMessage)


@pytest.mark.parametrize(
    "bad",
    [
        {"status": "maybe"},
        {"prompt_tokens": "10"},
        {"prompt_tokens": 1.5},
        {"cached_prompt_tokens": 11},
        {"duration_ms": "fast"},
        {"duration_ms": float("inf")},
        {"worker_id": ""},
        {"request_ms": "fast"},
        {"request_ms": [1.0, -2.0]},
        {"request_ms": [1.0] * (RESULT_REQUESTS_MAX + 1)},
        {"queried_tokens": 10, "hit_tokens": 11},
    ],
)
def test_signed_results_with_bad_fields_are_malformed(bad: dict[str, object]) -> None:
    body = {**dataclasses.asdict(result(1)), **bad}
    signed = BusCodec({"eu": EU_KEY})._encode("result", "eu", body)
    with pytest.raises(MalformedMessage):
        CODEC.decode_result(signed)


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", None, b"x" * 70_000])
def test_garbage_is_malformed(raw: bytes | None) -> None:
    with pytest.raises(MalformedMessage):
        CODEC.decode_job(raw, "eu")

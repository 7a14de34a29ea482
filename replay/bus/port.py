"""The job bus port: how replay jobs reach workers and results come back.

A scheduler publishes ``ReplayJob``s to its region; the region's workers share one consumer group
and each job goes to one of them. A worker pulls a job (``JobConsumer.next_job``) only when its
engine has spare capacity, and calls ``finish`` once the job is done (any status): only then may
the job's position be committed, and never past a job that is still running. A job delivered to
a consumer that stops (or crashes) before ``finish`` is delivered again to another consumer, so
delivery is at-least-once; replay is idempotent, so a duplicate costs only GPU time.

Errors: ``JobBusUnavailable`` (the transport failed or timed out; retryable), ``JobBusFull`` (an
in-process queue stayed full for the publish timeout), ``MalformedMessage`` (a record that does
not decode; consumers skip and commit past it, since it can never succeed).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Self, get_args

from eventlog.errors import InvalidRequest, Overloaded, Unavailable
from replay.model import ReplayJob, ReplayResult, ReplayStatus

RESULTS_TOPIC: Final = "convplane.replay.results"
JOBS_TOPIC_PREFIX: Final = "convplane.replay.jobs."
WORKER_GROUP_PREFIX: Final = "convplane.replay.workers."


def jobs_topic(region: str) -> str:
    return JOBS_TOPIC_PREFIX + region


def worker_group(region: str) -> str:
    return WORKER_GROUP_PREFIX + region


class JobBusUnavailable(Unavailable):
    code = "job_bus_unavailable"


class JobBusFull(Overloaded):
    code = "job_bus_full"


class MalformedMessage(InvalidRequest):
    code = "malformed_bus_message"


@dataclass(frozen=True, slots=True)
class JobDelivery:
    """One delivery of a job to one consumer; pass it back to ``finish``."""

    job: ReplayJob
    partition: int
    offset: int
    generation: int  # the consumer's bookkeeping epoch for the partition (see offsets.py)


class JobConsumer(ABC):
    """One member of a region's worker group."""

    region: str

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def next_job(self, timeout_s: float) -> JobDelivery | None:
        """The next job for this consumer, or None if none arrived within ``timeout_s``."""

    @abstractmethod
    async def finish(self, delivery: JobDelivery) -> None:
        """The job is done (any outcome): commit as far as no unfinished job is passed."""

    @abstractmethod
    async def close(self) -> None:
        """Commit what is finished and leave the group; unfinished jobs go to other members."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class ResultStream(ABC):
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def next_result(self, timeout_s: float) -> ReplayResult | None: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class JobBus(ABC):
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def publish_jobs(self, jobs: Sequence[ReplayJob]) -> None:
        """Durably enqueue jobs (each to its own region), keyed by conversation id."""

    @abstractmethod
    async def publish_result(self, result: ReplayResult) -> None: ...

    @abstractmethod
    def job_consumer(self, region: str, *, in_flight_max: int) -> JobConsumer:
        """A new member of ``region``'s worker group (not started)."""

    @abstractmethod
    def result_stream(self, *, group_id: str | None = None) -> ResultStream:
        """A reader of results (not started). With a group id, readers share the results."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


# --- wire format: JSON objects with the dataclass's field names -------------------------------

_STATUSES: Final = frozenset(get_args(ReplayStatus))


def encode_job(job: ReplayJob) -> bytes:
    return json.dumps(asdict(job), separators=(",", ":")).encode("utf-8")


def encode_result(result: ReplayResult) -> bytes:
    return json.dumps(asdict(result), separators=(",", ":")).encode("utf-8")


def _decode_fields(raw: bytes | None, cls: type[Any]) -> dict[str, Any]:
    try:
        obj = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"{cls.__name__}: not JSON") from exc
    if not isinstance(obj, dict):
        raise MalformedMessage(f"{cls.__name__}: not a JSON object")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in obj]
    if missing:
        raise MalformedMessage(f"{cls.__name__}: missing {missing}")
    return {n: obj[n] for n in names}  # unknown keys ignored: newer producers may add fields


def decode_job(raw: bytes | None) -> ReplayJob:
    values = _decode_fields(raw, ReplayJob)
    ints = ("estimated_prompt_tokens", "last_activity_ms", "deadline_ms", "through_seq")
    if not all(type(values[n]) is int for n in ints) or not all(
        isinstance(values[n], str) for n in values if n not in ints
    ):
        raise MalformedMessage("ReplayJob: field of the wrong type")
    return ReplayJob(**values)


def decode_result(raw: bytes | None) -> ReplayResult:
    values = _decode_fields(raw, ReplayResult)
    if values["status"] not in _STATUSES:
        raise MalformedMessage(f"ReplayResult: unknown status {values['status']!r}")
    return ReplayResult(**values)

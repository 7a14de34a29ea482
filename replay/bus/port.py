"""The job bus port: how replay jobs reach workers and results come back.

A scheduler publishes ``ReplayJob``s to its region; the region's workers share one consumer group
and each job goes to one of them. A worker pulls a job (``JobConsumer.next_job``) only when its
engine has spare capacity, and calls ``finish`` once the job is done (any status): only then may
the job's position be committed, and never past a job that is still running. A job delivered to
a consumer that stops (or crashes) before ``finish`` is delivered again to another consumer, so
delivery is at-least-once; replay is idempotent, so a duplicate costs only GPU time.

Errors: ``JobBusUnavailable`` (the transport failed or timed out; retryable), ``JobBusFull`` (an
in-process queue stayed full for the publish timeout), ``MalformedMessage`` (a record that does
not decode or validate; consumers skip and commit past it, since it can never succeed) and its
kind ``UnauthenticatedMessage`` (a record without a valid MAC: forged or tampered).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Self, get_args

from eventlog.errors import InvalidRequest, Overloaded, Unavailable
from replay.model import RESULT_REQUESTS_MAX, ReplayJob, ReplayResult, ReplayStatus
from replay.read_grant import READ_GRANT_CHARS_MAX

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


class UnauthenticatedMessage(MalformedMessage):
    code = "unauthenticated_bus_message"


@dataclass(frozen=True, slots=True)
class JobDelivery:
    """One delivery of a job to one consumer; pass it back to ``finish``."""

    job: ReplayJob
    partition: int
    offset: int
    generation: int  # the consumer's bookkeeping epoch for the partition (see offsets.py)
    #: the publisher's trace context (``replay.bus.trace_context``); empty without one
    trace_headers: tuple[tuple[str, bytes], ...] = ()


class JobConsumer(ABC):
    skipped_malformed = 0  # records that failed validation (adapters over untrusted transports)
    rejected_unauthenticated = 0  # ... of which without a valid MAC

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
    skipped_malformed = 0  # records that failed validation (adapters over untrusted transports)
    rejected_unauthenticated = 0  # ... of which without a valid MAC

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


# --- wire format: JSON objects with the dataclass's field names, every field checked ----------
#
# Records come from a topic anyone with broker access may write to: after the MAC
# (``replay.bus.codec``) every field is still validated as data, so a bad value is a
# ``MalformedMessage`` (skipped, counted), never a crash of the loop that reads it.

_STATUSES: Final = frozenset(get_args(ReplayStatus))
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # the API's id pattern (conversations, tenants)
# printable, no spaces: job (it names region, tenant, conversation and seq), worker, engine, revision
_NAME = re.compile(r"[\x21-\x7e]{1,512}")
_INT_MAX = 2**53 - 1  # what survives JSON everywhere (the API's bound too)
TOKENS_MAX = 10_000_000  # one conversation's prompt, at most (the API's token_count bound)

_JOB_IDS = ("tenant_id", "conversation_id")
_JOB_NAMES = ("job_id", "region", "model_revision")
_JOB_INTS = {
    "estimated_prompt_tokens": TOKENS_MAX,
    "last_activity_ms": _INT_MAX,
    "deadline_ms": _INT_MAX,
    "through_seq": _INT_MAX,
}
_RESULT_IDS = ("tenant_id", "conversation_id")
_RESULT_NAMES = ("job_id", "region", "model_revision", "worker_id", "engine_id")
_RESULT_INTS = {
    "prompt_tokens": TOKENS_MAX,
    "cached_prompt_tokens": TOKENS_MAX,
    # every piece queries the prefix before it again
    "queried_tokens": TOKENS_MAX * RESULT_REQUESTS_MAX,
    "hit_tokens": TOKENS_MAX * RESULT_REQUESTS_MAX,
    "finished_at_ms": _INT_MAX,
}


def job_body(job: ReplayJob) -> dict[str, Any]:
    return asdict(job)


def result_body(result: ReplayResult) -> dict[str, Any]:
    return asdict(result)


def _fields_of(obj: object, cls: type[Any]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise MalformedMessage(f"{cls.__name__}: not a JSON object")
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in obj]
    if missing:
        raise MalformedMessage(f"{cls.__name__}: missing {missing}")
    return {n: obj[n] for n in names}  # unknown keys ignored: newer producers may add fields


def _check(
    values: dict[str, Any],
    kind: str,
    ids: Sequence[str],
    names: Sequence[str],
    ints: dict[str, int],
) -> None:
    for name in ids:
        if not isinstance(values[name], str) or not _ID.fullmatch(values[name]):
            raise MalformedMessage(f"{kind}: bad {name}")
    for name in names:
        if not isinstance(values[name], str) or not _NAME.fullmatch(values[name]):
            raise MalformedMessage(f"{kind}: bad {name}")
    for name, maximum in ints.items():
        value = values[name]
        if type(value) is not int or not 0 <= value <= maximum:
            raise MalformedMessage(f"{kind}: {name} must be an integer in [0, {maximum}]")


def job_from_body(obj: object) -> ReplayJob:
    if isinstance(obj, dict):  # a job from before read grants has none (its reads are refused)
        obj = {"read_grant": "", **obj}
    values = _fields_of(obj, ReplayJob)
    grant = values["read_grant"]
    if not isinstance(grant, str) or len(grant) > READ_GRANT_CHARS_MAX or not grant.isascii():
        raise MalformedMessage("ReplayJob: bad read_grant")
    _check(values, "ReplayJob", _JOB_IDS, _JOB_NAMES, _JOB_INTS)
    if values["through_seq"] < 1:
        raise MalformedMessage("ReplayJob: through_seq must be >= 1")
    return ReplayJob(**values)


def result_from_body(obj: object) -> ReplayResult:
    if isinstance(obj, dict):  # a result from a worker before engine requests were reported
        obj = {"request_ms": [], "queried_tokens": 0, "hit_tokens": 0, **obj}
    values = _fields_of(obj, ReplayResult)
    request_ms = values["request_ms"]
    if (
        not isinstance(request_ms, list)
        or len(request_ms) > RESULT_REQUESTS_MAX
        or any(type(ms) not in (int, float) or not 0 <= ms <= 86_400_000 for ms in request_ms)
    ):
        raise MalformedMessage(
            f"ReplayResult: request_ms must be at most {RESULT_REQUESTS_MAX} durations in ms"
        )
    values["request_ms"] = tuple(float(ms) for ms in request_ms)
    _check(values, "ReplayResult", _RESULT_IDS, _RESULT_NAMES, _RESULT_INTS)
    if values["status"] not in _STATUSES:
        raise MalformedMessage(f"ReplayResult: unknown status {values['status']!r}")
    duration = values["duration_ms"]
    if type(duration) not in (int, float) or not 0 <= duration <= 86_400_000:
        raise MalformedMessage("ReplayResult: duration_ms must be a number of ms within a day")
    if (
        values["cached_prompt_tokens"] > values["prompt_tokens"]
        or values["hit_tokens"] > values["queried_tokens"]
    ):
        raise MalformedMessage("ReplayResult: more cached tokens than prompt tokens")
    return ReplayResult(**{**values, "duration_ms": float(duration)})

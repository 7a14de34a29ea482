"""The Kafka job bus (aiokafka).

Topics: ``convplane.replay.jobs.<region>`` (key = conversation id, so one conversation's jobs stay
in order on one partition) and ``convplane.replay.results``; created with the admin client, since
brokers run with ``auto.create.topics.enable=false``. The producer waits for all in-sync replicas
and is idempotent. Workers of a region form the group ``convplane.replay.workers.<region>`` with
auto-commit off: ``finish`` commits, per partition, the smallest offset still running (see
``offsets.py``), so a crash redelivers every unfinished job and never skips one.

A worker that pulls nothing for ``max_poll_interval_s`` (its engine has no spare) is dropped from
the group by aiokafka and its partitions move to workers that do pull; it rejoins when it pulls
again.

Every record is signed and checked (``replay.bus.codec``: a MAC under the region's replay
secret, then every field); a record that fails is skipped, logged, counted
(``rejected_unauthenticated``, ``skipped_malformed``) and committed past. Connections can use
TLS and SASL (``KafkaSecurity``: aiokafka's ``security_protocol``, ``ssl_context``,
``sasl_mechanism`` and credentials), the same for producer, consumers and admin client.

aiokafka errors and timeouts are translated once, here, into ``JobBusUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError, KafkaError
from opentelemetry.trace import TracerProvider

from replay.bus.codec import BusCodec, ForeignRegionRecord
from replay.bus.offsets import OffsetTracker
from replay.bus.port import (
    RESULTS_TOPIC,
    JobBus,
    JobBusUnavailable,
    JobConsumer,
    JobDelivery,
    MalformedMessage,
    ResultStream,
    UnauthenticatedMessage,
    jobs_topic,
    worker_group,
)
from replay.bus.trace_context import (
    RecordHeaders,
    current_headers,
    publish_span,
    received_headers,
)
from replay.model import ReplayJob, ReplayResult, message_key

log = logging.getLogger(__name__)
T = TypeVar("T")
_TOPIC_ALREADY_EXISTS = 36


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How clients connect: aiokafka's options. PLAINTEXT by default (a local broker)."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    ssl_cafile: str | None = None  # CA bundle to verify the brokers (system CAs when None)
    ssl_certfile: str | None = None  # client certificate (mutual TLS)
    ssl_keyfile: str | None = None
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        if self.protocol.startswith("SASL_"):
            if not self.sasl_username or self.sasl_password is None:
                raise JobBusUnavailable(f"kafka {self.protocol} needs a SASL username and password")
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return kwargs


@dataclass(frozen=True, slots=True)
class KafkaBusConfig:
    bootstrap_servers: str
    #: region -> replay secret: records are signed with, and checked against, these
    bus_secrets: Mapping[str, bytes] = field(default_factory=dict)
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    client_id: str = "convplane"
    partitions_per_topic: int = 8
    replication_factor: int = 1
    request_timeout_s: float = 10.0  # every single network await of this adapter
    start_timeout_s: float = 30.0  # connect + (for consumers) join the group
    publish_batch_max: int = 500
    max_poll_records: int = 16
    fetch_max_bytes: int = 1 << 20  # bounds what a consumer prefetches
    session_timeout_s: float = 10.0
    heartbeat_interval_s: float = 3.0
    max_poll_interval_s: float = 300.0
    results_batch_max: int = 100


async def _bounded(awaitable: Awaitable[T], timeout_s: float, what: str) -> T:
    """Await under a timeout; translate aiokafka's errors into JobBusUnavailable."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError as exc:
        raise JobBusUnavailable(f"kafka: {what} timed out after {timeout_s}s") from exc
    except KafkaError as exc:
        raise JobBusUnavailable(f"kafka: {what} failed: {exc!r}") from exc


async def ensure_topics(settings: KafkaBusConfig, topics: Sequence[str]) -> None:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.client_id}-admin",
        request_timeout_ms=int(settings.request_timeout_s * 1000),
        **settings.security.client_kwargs(),
    )
    try:
        await _bounded(admin.start(), settings.start_timeout_s, "admin start")
        new = [
            NewTopic(t, settings.partitions_per_topic, settings.replication_factor) for t in topics
        ]
        response = await _bounded(
            admin.create_topics(new, timeout_ms=int(settings.request_timeout_s * 1000)),
            settings.request_timeout_s * 2,
            "create topics",
        )
        for topic, code, *rest in response.topic_errors:
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise JobBusUnavailable(f"kafka: create topic {topic} failed: {code} {rest}")
    finally:
        await _bounded(admin.close(), settings.request_timeout_s, "admin close")


class KafkaJobBus(JobBus):
    def __init__(
        self,
        settings: KafkaBusConfig,
        *,
        regions: Sequence[str] = (),
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``tracer_provider``: traces publishes with it; None: OpenTelemetry's global one."""
        self.settings = settings
        self._tracer_provider = tracer_provider
        self._regions = tuple(regions)
        self._ensured: set[str] = set()
        self._producer: AIOKafkaProducer | None = None
        self._codec = BusCodec(settings.bus_secrets)

    async def start(self) -> None:
        s = self.settings
        await self._ensure([RESULTS_TOPIC, *(jobs_topic(r) for r in self._regions)])
        producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=int(s.request_timeout_s * 1000),
            **s.security.client_kwargs(),
        )
        await _bounded(producer.start(), s.start_timeout_s, "producer start")
        self._producer = producer

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await _bounded(producer.stop(), self.settings.request_timeout_s, "producer stop")

    async def _ensure(self, topics: Sequence[str]) -> None:
        missing = [t for t in topics if t not in self._ensured]
        if missing:
            await ensure_topics(self.settings, missing)
            self._ensured.update(missing)

    def _started(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise JobBusUnavailable("KafkaJobBus used before start()")
        return self._producer

    async def publish_jobs(self, jobs: Sequence[ReplayJob]) -> None:
        producer = self._started()
        await self._ensure(sorted({jobs_topic(job.region) for job in jobs}))
        for first in range(0, len(jobs), self.settings.publish_batch_max):
            batch = jobs[first : first + self.settings.publish_batch_max]
            with publish_span(batch[0].region, len(batch), self._tracer_provider):
                await _bounded(
                    self._send_batch(producer, self._codec, batch, current_headers()),
                    self.settings.request_timeout_s,
                    f"publish {len(batch)} jobs",
                )

    @staticmethod
    async def _send_batch(
        producer: AIOKafkaProducer,
        codec: BusCodec,
        batch: Sequence[ReplayJob],
        headers: RecordHeaders,
    ) -> None:
        acks = [
            await producer.send(
                jobs_topic(job.region),
                codec.encode_job(job),
                key=message_key(job.tenant_id, job.conversation_id),
                headers=list(headers) or None,
            )
            for job in batch
        ]
        await asyncio.gather(*acks)

    async def publish_result(self, result: ReplayResult) -> None:
        producer = self._started()
        await _bounded(
            producer.send_and_wait(
                RESULTS_TOPIC,
                self._codec.encode_result(result),
                key=message_key(result.tenant_id, result.conversation_id),
            ),
            self.settings.request_timeout_s,
            "publish result",
        )

    def job_consumer(self, region: str, *, in_flight_max: int) -> JobConsumer:
        return KafkaJobConsumer(self.settings, region, in_flight_max=in_flight_max)

    def result_stream(self, *, group_id: str | None = None) -> ResultStream:
        return KafkaResultStream(self.settings, group_id=group_id)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaJobConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._owner.partitions_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        return None


class KafkaJobConsumer(JobConsumer):
    def __init__(self, settings: KafkaBusConfig, region: str, *, in_flight_max: int) -> None:
        self.region = region
        self.topic = jobs_topic(region)
        self._s = settings
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker(in_flight_max)
        self._to_commit: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._pull_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._codec = BusCodec(settings.bus_secrets)
        self.skipped_malformed = 0  # records that failed validation (rejected ones included)
        self.rejected_unauthenticated = 0  # records without a valid MAC: forged or tampered

    async def start(self) -> None:
        s = self._s
        await ensure_topics(s, [self.topic])
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}-worker",
            group_id=worker_group(self.region),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.max_poll_records,
            fetch_max_bytes=s.fetch_max_bytes,
            max_partition_fetch_bytes=min(s.fetch_max_bytes, 1 << 20),
            request_timeout_ms=int(s.request_timeout_s * 1000) + 5000,
            session_timeout_ms=int(s.session_timeout_s * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
            max_poll_interval_ms=int(s.max_poll_interval_s * 1000),
            **s.security.client_kwargs(),
        )
        consumer.subscribe([self.topic], listener=_Rebalance(self))
        await _bounded(consumer.start(), s.start_timeout_s, "consumer start")
        self._consumer = consumer

    def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise JobBusUnavailable(f"job consumer for {self.region} is not running")
        return self._consumer

    async def next_job(self, timeout_s: float) -> JobDelivery | None:
        async with self._pull_lock:  # one getmany at a time; deliveries are tracked in order
            consumer = self._started()
            records = await _bounded(
                consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=1),
                timeout_s + self._s.request_timeout_s,
                "poll",
            )
            for tp, batch in records.items():
                for record in batch:
                    generation = self._tracker.delivered(tp, record.offset)
                    try:
                        job = self._codec.decode_job(record.value, self.region)
                    except MalformedMessage as exc:
                        log.error("rejecting %s@%d: %s", tp, record.offset, exc)
                        self.skipped_malformed += 1
                        self.rejected_unauthenticated += isinstance(exc, UnauthenticatedMessage)
                        self._note_finished(tp, record.offset, generation)
                        continue
                    trace_headers = received_headers(record.headers)
                    return JobDelivery(job, tp.partition, record.offset, generation, trace_headers)
        await self._commit_pending()
        return None

    async def finish(self, delivery: JobDelivery) -> None:
        tp = TopicPartition(self.topic, delivery.partition)
        self._note_finished(tp, delivery.offset, delivery.generation)
        await self._commit_pending()

    def _note_finished(self, tp: TopicPartition, offset: int, generation: int) -> None:
        position = self._tracker.finished(tp, offset, generation)
        if position is not None:
            self._to_commit[tp] = max(position, self._to_commit.get(tp, -1))

    async def _commit_pending(self) -> None:
        """Commit the finished positions. Commits run one at a time, in order, so an offset
        never goes backwards; a finish that arrives during a commit leaves its position to that
        commit's next round instead of queueing a commit of its own (fewer round trips)."""
        consumer = self._consumer
        if consumer is None or self._commit_lock.locked():
            return
        async with self._commit_lock:
            while True:
                assigned = consumer.assignment()
                offsets = {
                    tp: pos
                    for tp, pos in self._to_commit.items()
                    if tp in assigned and pos > self._committed.get(tp, -1)
                }
                self._to_commit.clear()
                if not offsets:
                    return
                try:
                    await _bounded(consumer.commit(offsets), self._s.request_timeout_s, "commit")
                except JobBusUnavailable as exc:
                    if isinstance(exc.__cause__, CommitFailedError):
                        log.warning("commit lost to a rebalance; jobs will be redelivered: %s", exc)
                        return
                    raise
                for tp, pos in offsets.items():
                    self._committed[tp] = pos

    async def partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit what is finished on the revoked partitions, then forget them."""
        consumer = self._consumer
        offsets = {tp: self._to_commit.pop(tp) for tp in revoked if tp in self._to_commit}
        if consumer is not None and offsets:
            try:
                await _bounded(consumer.commit(offsets), self._s.request_timeout_s, "commit")
            except JobBusUnavailable as exc:
                log.warning("commit on revoke failed; jobs will be redelivered: %s", exc)
        for tp in revoked:
            running = self._tracker.forget(tp)
            self._committed.pop(tp, None)
            if running:
                log.info(
                    "%s revoked with %d jobs running; they will be redelivered", tp, len(running)
                )

    def assigned_partitions(self) -> set[int]:
        consumer = self._consumer
        return set() if consumer is None else {tp.partition for tp in consumer.assignment()}

    def committed_positions(self) -> dict[int, int]:
        """Partition -> offset committed by this consumer (for tests and metrics)."""
        return {tp.partition: pos for tp, pos in self._committed.items()}

    async def close(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:  # let a running commit end, then commit the rest
            pass
        with contextlib.suppress(JobBusUnavailable):
            await self._commit_pending()
        self._consumer = None
        await _bounded(consumer.stop(), self._s.request_timeout_s + 5, "consumer stop")


class KafkaResultStream(ResultStream):
    def __init__(self, settings: KafkaBusConfig, *, group_id: str | None) -> None:
        self._s = settings
        self._group_id = group_id
        self._buffer: deque[ReplayResult] = deque()
        self._consumer: AIOKafkaConsumer | None = None
        self._codec = BusCodec(settings.bus_secrets)
        self.skipped_malformed = 0
        self.rejected_unauthenticated = 0
        self.skipped_foreign = 0  # results of regions whose secret this reader does not hold

    async def start(self) -> None:
        s = self._s
        await ensure_topics(s, [RESULTS_TOPIC])
        consumer = AIOKafkaConsumer(
            RESULTS_TOPIC,
            bootstrap_servers=s.bootstrap_servers,
            client_id=f"{s.client_id}-results",
            group_id=self._group_id,
            enable_auto_commit=self._group_id is not None,
            auto_offset_reset="earliest",
            max_poll_records=s.results_batch_max,
            fetch_max_bytes=s.fetch_max_bytes,
            request_timeout_ms=int(s.request_timeout_s * 1000) + 5000,
            **s.security.client_kwargs(),
        )
        await _bounded(consumer.start(), s.start_timeout_s, "results consumer start")
        self._consumer = consumer

    async def next_result(self, timeout_s: float) -> ReplayResult | None:
        if not self._buffer:
            consumer = self._consumer
            if consumer is None:
                raise JobBusUnavailable("result stream is not running")
            records = await _bounded(
                consumer.getmany(
                    timeout_ms=int(timeout_s * 1000), max_records=self._s.results_batch_max
                ),
                timeout_s + self._s.request_timeout_s,
                "poll results",
            )
            for batch in records.values():
                for record in batch:
                    try:
                        self._buffer.append(self._codec.decode_result(record.value))
                    except ForeignRegionRecord:
                        self.skipped_foreign += 1
                    except MalformedMessage as exc:
                        log.error("rejecting result %s@%d: %s", record.topic, record.offset, exc)
                        self.skipped_malformed += 1
                        self.rejected_unauthenticated += isinstance(exc, UnauthenticatedMessage)
        return self._buffer.popleft() if self._buffer else None

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await _bounded(consumer.stop(), self._s.request_timeout_s + 5, "results consumer stop")

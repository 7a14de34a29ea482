"""The Kafka job bus on a real broker: delivery, commit positions, redelivery, results."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from replay.bus.codec import BusCodec
from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaJobConsumer
from replay.bus.port import RESULTS_TOPIC, JobDelivery, jobs_topic
from replay.bus.trace_context import job_span
from replay.model import ReplayJob, ReplayResult
from tests.integration.bus_regions import FreshRegions
from tests.integration.kafka_replay import committed_offset

pytestmark = pytest.mark.kafka


REGIONS = FreshRegions()
fresh_region = REGIONS.fresh


def job(n: int, region: str) -> ReplayJob:
    return ReplayJob(f"{region}-j{n}", region, "t1", f"c{n}", "rev-a", 100, 0, 10**13, 3)


@pytest.fixture
def settings(kafka_bootstrap_servers: str) -> KafkaBusConfig:
    return KafkaBusConfig(
        kafka_bootstrap_servers,
        bus_secrets=REGIONS.secrets,
        partitions_per_topic=1,
        session_timeout_s=6.0,
        heartbeat_interval_s=1.0,
    )


@pytest.fixture
async def bus(settings: KafkaBusConfig) -> AsyncIterator[KafkaJobBus]:
    async with KafkaJobBus(settings) as b:
        yield b


async def test_offsets_are_committed_only_up_to_the_first_unfinished_job(
    bus: KafkaJobBus, settings: KafkaBusConfig
) -> None:
    region = fresh_region()
    await bus.publish_jobs([job(n, region) for n in range(5)])
    consumer = KafkaJobConsumer(settings, region, in_flight_max=5)
    async with consumer:
        deliveries: list[JobDelivery] = []
        while len(deliveries) < 5:
            delivery = await consumer.next_job(timeout_s=5.0)
            assert delivery is not None, "jobs published but not delivered"
            deliveries.append(delivery)
        assert [d.offset for d in deliveries] == [0, 1, 2, 3, 4]
        assert [d.job.job_id for d in deliveries] == [f"{region}-j{n}" for n in range(5)]

        await consumer.finish(deliveries[2])
        await consumer.finish(deliveries[3])  # finished out of order: 0 and 1 still run
        assert await committed_offset(settings, region) is None
        await consumer.finish(deliveries[0])
        assert await committed_offset(settings, region) == 1  # 1 is still running
        await consumer.finish(deliveries[4])
        assert await committed_offset(settings, region) == 1
    # closed with offset 1 unfinished: it must come back, first
    assert await committed_offset(settings, region) == 1
    async with KafkaJobConsumer(settings, region, in_flight_max=5) as again:
        redelivered = await again.next_job(timeout_s=10.0)
        assert redelivered is not None
        assert (redelivered.offset, redelivered.job.job_id) == (1, f"{region}-j1")
        await again.finish(redelivered)
    assert await committed_offset(settings, region) == 2


async def test_malformed_forged_and_tampered_records_are_rejected_counted_and_committed_past(
    bus: KafkaJobBus, settings: KafkaBusConfig
) -> None:
    region = fresh_region()
    await bus.publish_jobs([job(0, region)])  # creates the topic
    producer = bus._started()
    topic = jobs_topic(region)
    await producer.send_and_wait(topic, b"{not json", key=b"c9")
    forged = dataclasses.asdict(job(7, region))  # another tenant's conversation, unsigned
    await producer.send_and_wait(topic, json.dumps({**forged, "tenant_id": "t2"}).encode())
    signed = json.loads(BusCodec(settings.bus_secrets).encode_job(job(8, region)))
    signed["body"]["tenant_id"] = "t2"  # tampered after signing
    await producer.send_and_wait(topic, json.dumps(signed).encode())
    await bus.publish_jobs([job(2, region)])
    async with KafkaJobConsumer(settings, region, in_flight_max=2) as consumer:
        got = []
        for _ in range(20):
            delivery = await consumer.next_job(timeout_s=1.0)
            if delivery is not None:
                got.append(delivery)
                await consumer.finish(delivery)
            if len(got) == 2:
                break
        assert [d.offset for d in got] == [0, 4]
        assert [d.job.tenant_id for d in got] == ["t1", "t1"]
        assert consumer.skipped_malformed == 3
        assert consumer.rejected_unauthenticated == 2
    assert await committed_offset(settings, region) == 5


async def test_results_round_trip(bus: KafkaJobBus) -> None:
    region = fresh_region()
    sent = ReplayResult(
        f"{region}-j1",
        region,
        "t1",
        "c1",
        "rev-a",
        "replayed",
        "w1",
        "e1",
        120,
        64,
        12.5,
        1_700_000_000_000,
    )
    forged = {**dataclasses.asdict(sent), "worker_id": "w-evil", "prompt_tokens": "x"}
    await bus._started().send_and_wait(RESULTS_TOPIC, json.dumps(forged).encode())
    await bus.publish_result(sent)
    async with bus.result_stream() as stream:
        for _ in range(50):
            got = await stream.next_result(timeout_s=1.0)
            if got is not None and got.region == region:
                break
        assert got == sent  # the forged one before it was rejected, and the loop lived on
        assert stream.rejected_unauthenticated >= 1


async def test_a_job_carries_its_publishers_trace_context(settings: KafkaBusConfig) -> None:
    region = fresh_region()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with KafkaJobBus(settings, tracer_provider=provider) as traced:
        await traced.publish_jobs([job(1, region)])
    async with KafkaJobConsumer(settings, region, in_flight_max=1) as consumer:
        delivery = await consumer.next_job(timeout_s=10.0)
        assert delivery is not None, "job published but not delivered"
        await consumer.finish(delivery)
    assert [name for name, _ in delivery.trace_headers] == ["traceparent"]
    (publish,) = [s for s in spans.get_finished_spans() if s.name == "replay.publish"]
    with job_span(delivery.trace_headers, {"convplane.worker": "w1"}, provider):
        pass
    job_run = next(s for s in spans.get_finished_spans() if s.name == "replay.job")
    assert job_run.parent is not None and job_run.parent.span_id == publish.context.span_id
    assert job_run.context.trace_id == publish.context.trace_id
    provider.shutdown()

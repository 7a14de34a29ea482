"""The job bus over SASL and over SASL + TLS, on a broker of the project's harness started with
those listeners (``services.local.kafka.BrokerSecurity``): signed jobs and results round-trip,
and a wrong password is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaJobConsumer, KafkaSecurity
from replay.bus.port import JobBusUnavailable
from replay.model import ReplayJob
from services.local.kafka import BrokerSecurity, KafkaBroker, start_broker
from tests.integration.bus_regions import FreshRegions

pytestmark = pytest.mark.kafka

USER, PASSWORD = "convplane-worker", "s3cret-for-tests"
REGIONS = FreshRegions("s")


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    base: Path = tmp_path_factory.mktemp("kafka-secure")
    broker = start_broker(base, security=BrokerSecurity({USER: PASSWORD}, tls=True))
    try:
        yield broker
    finally:
        broker.stop()


def settings(servers: str | None, security: KafkaSecurity) -> KafkaBusConfig:
    assert servers is not None
    return KafkaBusConfig(
        servers, bus_secrets=REGIONS.secrets, security=security, partitions_per_topic=1,
        session_timeout_s=6.0, heartbeat_interval_s=1.0, start_timeout_s=20.0,
    )  # fmt: skip


async def round_trip(bus_settings: KafkaBusConfig) -> None:
    region = REGIONS.fresh()
    job = ReplayJob(f"{region}-j1", region, "t1", "c1", "rev-a", 100, 0, 10**13, 3)
    async with KafkaJobBus(bus_settings, regions=[region]) as bus:
        await bus.publish_jobs([job])
        async with KafkaJobConsumer(bus_settings, region, in_flight_max=1) as consumer:
            for _ in range(30):
                delivery = await consumer.next_job(timeout_s=1.0)
                if delivery is not None:
                    break
            assert delivery is not None and delivery.job == job
            await consumer.finish(delivery)


async def test_jobs_round_trip_over_sasl(secure_broker: KafkaBroker) -> None:
    security = KafkaSecurity("SASL_PLAINTEXT", sasl_username=USER, sasl_password=PASSWORD)
    await round_trip(settings(secure_broker.sasl_bootstrap_servers, security))


async def test_jobs_round_trip_over_sasl_and_tls(secure_broker: KafkaBroker) -> None:
    assert secure_broker.tls is not None
    security = KafkaSecurity(
        "SASL_SSL", ssl_cafile=str(secure_broker.tls.ca_cert),
        sasl_username=USER, sasl_password=PASSWORD,
    )  # fmt: skip
    await round_trip(settings(secure_broker.sasl_ssl_bootstrap_servers, security))


async def test_a_wrong_password_is_refused(secure_broker: KafkaBroker) -> None:
    security = KafkaSecurity("SASL_PLAINTEXT", sasl_username=USER, sasl_password="wrong")
    with pytest.raises(JobBusUnavailable):
        await round_trip(settings(secure_broker.sasl_bootstrap_servers, security))

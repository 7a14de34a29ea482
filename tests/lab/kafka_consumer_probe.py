"""A replay job consumer for a lab host: ``python -m tests.lab.kafka_consumer_probe SERVERS CAFILE
USER PASSWORD REGION`` takes one job of ``REGION`` over SASL_SSL (the broker's certificate
checked against CAFILE), prints its id as JSON and exits 0; exits 1 when none came in time."""

from __future__ import annotations

import asyncio
import json
import sys

from replay.bus.kafka import KafkaBusConfig, KafkaJobConsumer, KafkaSecurity
from tests.integration.bus_regions import BUS_SECRET

WAIT_S = 60.0


async def take_one(servers: str, cafile: str, user: str, password: str, region: str) -> int:
    security = KafkaSecurity(
        "SASL_SSL", ssl_cafile=cafile, sasl_username=user, sasl_password=password
    )
    settings = KafkaBusConfig(
        servers, bus_secrets={region: BUS_SECRET}, security=security, partitions_per_topic=1,
        session_timeout_s=6.0, heartbeat_interval_s=1.0, start_timeout_s=30.0,
    )  # fmt: skip
    async with KafkaJobConsumer(settings, region, in_flight_max=1) as consumer:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            delivery = await consumer.next_job(timeout_s=1.0)
            if delivery is not None:
                await consumer.finish(delivery)
                print(json.dumps({"job_id": delivery.job.job_id}), flush=True)
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(take_one(*sys.argv[1:6])))

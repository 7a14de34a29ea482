"""Replay jobs over a Kafka broker on an address of the machine other than loopback (the lab's
bridge address): the broker listens and advertises only there, its TLS certificate names only
that address, and a worker on another host (a lab host: its own network namespace) takes a job
published from the root namespace over SASL and TLS, the certificate checked.

Needs the lab and the broker's jars (``.cache/kafka``); fails loudly without them, never skips.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaSecurity
from replay.model import ReplayJob
from services.local.kafka import BrokerSecurity, start_broker
from tests.harness.lab import Lab
from tests.integration.bus_regions import FreshRegions

pytestmark = pytest.mark.kafka

USER, PASSWORD = "convplane-worker", "s3cret-for-lab-tests"
ROOT = Path(__file__).resolve().parents[2]
CONSUMER_WAIT_S = 120.0


async def test_a_worker_on_another_host_takes_jobs_from_a_broker_on_a_real_address(
    lab: Lab, tmp_path: Path
) -> None:
    worker_host = lab.add_host("worker", cpu_quota=1.0)
    broker = start_broker(
        tmp_path / "kafka", security=BrokerSecurity({USER: PASSWORD}, tls=True), host=lab.address
    )
    try:
        assert broker.tls is not None and broker.sasl_ssl_bootstrap_servers is not None
        servers = broker.sasl_ssl_bootstrap_servers
        host, port = servers.rsplit(":", 1)
        assert host == lab.address and broker.bootstrap_servers.startswith(f"{lab.address}:")
        with socket.socket() as sock:  # nothing of it on loopback
            assert sock.connect_ex(("127.0.0.1", int(port))) != 0
        regions = FreshRegions("lab")
        region = regions.fresh()
        security = KafkaSecurity(
            "SASL_SSL", ssl_cafile=str(broker.tls.ca_cert), sasl_username=USER,
            sasl_password=PASSWORD,
        )  # fmt: skip
        settings = KafkaBusConfig(
            servers, bus_secrets=regions.secrets, security=security, partitions_per_topic=1,
            start_timeout_s=30.0,
        )  # fmt: skip
        job = ReplayJob(f"{region}-j1", region, "t1", "c1", "rev-a", 100, 0, 10**13, 3)
        async with KafkaJobBus(settings, regions=[region]) as bus:
            await bus.publish_jobs([job])
        consumer = worker_host.run(
            [sys.executable, "-m", "tests.lab.kafka_consumer_probe", servers,
             str(broker.tls.ca_cert), USER, PASSWORD, region],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = consumer.communicate(timeout=CONSUMER_WAIT_S)
        finally:
            consumer.kill()
        assert consumer.returncode == 0, err.decode(errors="replace")[-3000:]
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"job_id": job.job_id}
    finally:
        broker.stop()

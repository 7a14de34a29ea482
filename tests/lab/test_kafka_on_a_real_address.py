"""Replay jobs over the local Kafka broker on an address of the machine other than loopback
(the lab's bridge address), started as a user starts it: ``convplane kafka up --host``. There
it takes only SASL over TLS, its certificate naming that address, with a password and CA it
writes to ``client.json``; its unauthenticated listeners stay on loopback. A worker on another
host (a lab host: its own network namespace) takes a job published from the root namespace.

Needs the lab and the broker's jars (``.cache/kafka``); fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaSecurity
from replay.model import ReplayJob
from services.local.kafka import KafkaBroker
from tests.e2e.plane import CONVPLANE, REPO_ROOT, convplane_env, run_convplane
from tests.harness.lab import Lab
from tests.integration.bus_regions import FreshRegions

pytestmark = pytest.mark.kafka

CONSUMER_WAIT_S = 120.0


def _listening(address: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((address, port)) == 0


async def _publish(settings: KafkaBusConfig, job: ReplayJob) -> None:
    async with KafkaJobBus(settings, regions=[job.region]) as bus:
        await bus.publish_jobs([job])


def test_a_worker_on_another_host_takes_jobs_from_a_broker_on_a_real_address(
    lab: Lab, tmp_path: Path
) -> None:
    worker_host = lab.add_host("worker", cpu_quota=1.0)
    state_dir = tmp_path / "kafka"
    broker = subprocess.Popen(
        [*CONVPLANE, "kafka", "up", "--state-dir", str(state_dir), "--host", lab.address,
         "--cache-dir", str(REPO_ROOT / ".cache" / "kafka")],
        env=convplane_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert broker.stdout is not None and broker.stderr is not None
        servers = broker.stdout.readline().strip()  # once it serves
        assert servers, f"kafka up exited: {broker.wait(timeout=60)} {broker.stderr.read()}"
        client = json.loads((state_dir / "client.json").read_text())
        assert client["bootstrap_servers"] == servers, client
        host, port = servers.rsplit(":", 1)
        assert host == lab.address and not _listening("127.0.0.1", int(port))
        properties = (state_dir / "server.properties").read_text()
        for name in ("PLAINTEXT", "SASL_PLAINTEXT", "CONTROLLER"):  # nothing unauthenticated
            (listener,) = [
                item for item in properties.split("listeners=", 1)[1].splitlines()[0].split(",")
                if item.startswith(f"{name}://")
            ]  # fmt: skip
            assert listener.startswith(f"{name}://127.0.0.1:"), listener
            assert not _listening(lab.address, int(listener.rsplit(":", 1)[1])), listener
        regions = FreshRegions("lab")
        region = regions.fresh()
        security = KafkaSecurity(
            "SASL_SSL", ssl_cafile=client["ssl_cafile"], sasl_username=client["sasl_username"],
            sasl_password=client["sasl_password"],
        )  # fmt: skip
        settings = KafkaBusConfig(
            servers, bus_secrets=regions.secrets, security=security, partitions_per_topic=1,
            start_timeout_s=30.0,
        )  # fmt: skip
        job = ReplayJob(f"{region}-j1", region, "t1", "c1", "rev-a", 100, 0, 10**13, 3)
        asyncio.run(_publish(settings, job))
        consumer = worker_host.run(
            [sys.executable, "-m", "tests.lab.kafka_consumer_probe", servers,
             client["ssl_cafile"], client["sasl_username"], client["sasl_password"], region],
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = consumer.communicate(timeout=CONSUMER_WAIT_S)
        finally:
            consumer.kill()
        assert consumer.returncode == 0, err.decode(errors="replace")[-3000:]
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"job_id": job.job_id}
    finally:
        broker.send_signal(signal.SIGTERM)  # as a supervisor stops it
        try:
            _, said = broker.communicate(timeout=60)  # its pipes read to the end and closed
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.communicate()
            raise
    assert broker.returncode == 0 and "stopping kafka" in said, said
    assert not _listening(host, int(port))  # the broker itself is gone, not only the CLI


def test_a_broker_on_a_real_address_without_tls_is_refused(lab: Lab, tmp_path: Path) -> None:
    from services.local.kafka import KafkaHarnessError, start_broker

    with pytest.raises(KafkaHarnessError, match="needs SASL over TLS"):
        broker: KafkaBroker = start_broker(tmp_path / "kafka", host=lab.address)
        broker.stop()
    assert not (tmp_path / "kafka").exists()  # refused before anything was written
    refused = run_convplane("kafka", "up", "--state-dir", str(tmp_path / "k2"), "--host", "0.0.0.0")
    assert refused.returncode == 1 and "is not one address" in refused.stderr, refused.stderr

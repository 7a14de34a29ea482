"""A local plane on an address of the machine other than loopback (the lab's bridge address):
its nodes and its databases listen there, and TLS to the databases verifies against it; and
``convplane up --host`` puts one there from the command line, resumed there by a plain ``up``.

Needs the lab and local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from services.local.plane import LocalPlane
from tests.e2e.plane import run_convplane
from tests.harness.lab import Lab


@pytest.mark.postgres
async def test_a_plane_on_a_real_address_puts_its_databases_there(
    lab: Lab, chaos_dir: Path
) -> None:
    for start in ("first start", "resumed on its data"):
        plane = LocalPlane(
            regions=2, state_dir=chaos_dir / "plane", base_port=0, postgres=True,
            host=lab.address, shard_count=4,
        )  # fmt: skip
        try:
            info = await asyncio.to_thread(plane.start)
            for region in info["regions"]:
                assert urlsplit(region["url"]).hostname == lab.address, start
                assert urlsplit(region["dsn"]).hostname == lab.address, start
            async with httpx.AsyncClient(trust_env=False) as client:
                for region in info["regions"]:
                    assert (await client.get(region["url"] + "/healthz")).status_code == 200
        finally:
            await asyncio.to_thread(plane.stop)


def test_up_with_host_serves_there_and_a_plain_up_resumes_there(lab: Lab, chaos_dir: Path) -> None:
    state_dir = chaos_dir / "up-plane"
    for args in (["--host", lab.address], []):  # made there; then resumed without the option
        started = run_convplane("up", "--state-dir", str(state_dir), "--base-port", "0",
                                "--shard-count", "4", "--detach", *args)  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        try:
            info = json.loads((state_dir / "cluster.json").read_text())
            for region in info["regions"]:
                url = urlsplit(region["url"])
                assert url.hostname == lab.address, (args, region["url"])
                assert httpx.get(region["url"] + "/healthz", timeout=10.0).status_code == 200
                with socket.socket() as sock:  # nothing of it on loopback
                    assert sock.connect_ex(("127.0.0.1", url.port or 0)) != 0, region
        finally:
            down = run_convplane("down", "--state-dir", str(state_dir))
            assert down.returncode == 0, down.stdout + down.stderr

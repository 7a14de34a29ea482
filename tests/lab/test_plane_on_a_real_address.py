"""A local plane on an address of the machine other than loopback (the lab's bridge address):
its nodes and its databases listen there, and TLS to the databases verifies against it.

Needs the lab and local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from services.local.plane import LocalPlane
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

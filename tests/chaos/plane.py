"""The plane every chaos test starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.harness.chaos import ChaosPlane


def chaos_plane(chaos_dir: Path, shard_count: int, *, proxied: bool = False) -> ChaosPlane:
    """3 regions on PostgreSQL under ``chaos_dir``; ``proxied``: every inter-region link through
    a fault proxy on the running (the test's) event loop."""
    return ChaosPlane(
        regions=3,
        state_dir=chaos_dir / "plane",
        base_port=0,
        postgres=True,
        shard_count=shard_count,
        proxied=proxied,
        loop=asyncio.get_running_loop() if proxied else None,
    )

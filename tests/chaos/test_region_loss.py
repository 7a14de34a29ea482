"""Chaos: kill -9 a whole region (node and PostgreSQL) under concurrent writers, fail over,
restart it, fail back; then audit every replica directly (``chaos_scenarios.region_loss``). The
same on hosts of their own: ``tests/lab/test_region_loss_on_lab.py``.

Needs local PostgreSQL binaries (``services.local.postgres``); fails loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.plane import chaos_plane
from tests.harness.chaos_scenarios import region_loss

SHARDS = 24


@pytest.mark.postgres
async def test_kill9_region_fails_over_then_back_without_losing_acks(chaos_dir: Path) -> None:
    report = await region_loss(chaos_plane(chaos_dir, SHARDS), SHARDS)
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100

"""Chaos: partition one region away (every link to and from the other regions' nodes and
databases black-holed by fault proxies), fail over, heal, fail back; audit every replica
(``chaos_scenarios.partition``). The same with dropped packets between hosts of their own:
``tests/lab/test_partition_on_lab.py``.

The minority side must acknowledge nothing while cut off. Needs local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.plane import chaos_plane
from tests.harness.chaos_scenarios import partition

SHARDS = 24


@pytest.mark.postgres
async def test_partitioned_region_acks_nothing_and_its_shards_fail_over(chaos_dir: Path) -> None:
    plane = chaos_plane(chaos_dir, SHARDS, proxied=True)
    report = await partition(plane, SHARDS)
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100

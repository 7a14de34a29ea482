"""Which node slot of a region leads each shard (``regions.placement.SlotMap``): each region's
own shards dealt to its slots in turn, and so are the shards another region's loss brings it;
a shard's slot never depends on which regions are up."""

from __future__ import annotations

from collections import Counter

import pytest

from regions.placement import SlotMap, place_shards, rank_regions

WEIGHTS = {"ap-south": 1.0, "eu-west": 1.0, "us-east": 1.0}
SHARDS = 64


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_a_regions_own_shards_are_dealt_evenly_to_its_slots(nodes: int) -> None:
    slots = SlotMap(SHARDS, WEIGHTS)
    home = place_shards(SHARDS, WEIGHTS)
    for region in WEIGHTS:
        counts = Counter(slots.slot(s, nodes) for s, r in home.items() if r == region)
        assert set(counts) == set(range(nodes))
        assert max(counts.values()) - min(counts.values()) <= 1, (region, counts)


def test_the_shards_a_lost_region_brings_are_dealt_evenly_too() -> None:
    slots = SlotMap(SHARDS, WEIGHTS)
    home = place_shards(SHARDS, WEIGHTS)
    survivors = {r: w for r, w in WEIGHTS.items() if r != "us-east"}
    for region in survivors:
        brought = [s for s, r in home.items() if r == "us-east"
                   and rank_regions(s, survivors)[0] == region]  # fmt: skip
        counts = Counter(slots.slot(s, 2) for s in brought)
        assert max(counts.values()) - min(counts.values()) <= 1, (region, counts)


def test_a_shards_slot_depends_on_the_cluster_file_alone() -> None:
    """Built again (another node, a restart), the map is the same; a region of one node has
    one slot; the control shard (numbered after the log's shards) has a slot too."""
    first, again = SlotMap(SHARDS, WEIGHTS), SlotMap(SHARDS, dict(reversed(WEIGHTS.items())))
    assert [first.slot(s, 3) for s in range(SHARDS + 1)] == [
        again.slot(s, 3) for s in range(SHARDS + 1)
    ]
    assert {first.slot(s, 1) for s in range(SHARDS + 1)} == {0}

"""Shard placement: weighted rendezvous (highest-random-weight) hashing over healthy regions.

Each (shard, region) pair gets a score ``-weight / ln(u)`` with ``u`` a stable hash in (0, 1);
the highest score wins. Removing a region moves only the shards it held; adding it back moves
back only shards whose top score is the returning region. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from eventlog.sharding import stable_hash

_HASH_SPACE = float(2**64)


def _score(shard: int, region: str, weight: float) -> float:
    u = (stable_hash(f"{shard}/{region}") + 0.5) / _HASH_SPACE  # strictly inside (0, 1)
    return -weight / math.log(u)


def rank_regions(shard: int, weights: Mapping[str, float]) -> list[str]:
    """Regions in preference order for ``shard`` (best first); zero weights are excluded."""
    candidates = [(r, w) for r, w in sorted(weights.items()) if w > 0]
    return [r for r, _ in sorted(candidates, key=lambda rw: -_score(shard, rw[0], rw[1]))]


def place_shards(shard_count: int, weights: Mapping[str, float]) -> dict[int, str]:
    """shard -> region for every shard; raises ValueError when no region has positive weight."""
    if not any(w > 0 for w in weights.values()):
        raise ValueError("no region with positive capacity weight")
    return {shard: rank_regions(shard, weights)[0] for shard in range(shard_count)}


class SlotMap:
    """Which of a region's N node slots leads each shard while the region leads it (the node
    holding that slot's lease leads it, ``eventlog.stores.region_lease``): the shard's rank
    among its home region's shards (those ``place_shards`` gives it with every region up, in
    the order of the region each falls back to), modulo N.

    Stable: the home placement depends on the cluster file alone, so a shard keeps its slot
    through every failover and failback of regions. Balanced: a region's own shards are dealt
    to its slots in turn (a hash of the shard left one node of two 6 shards and its sibling 11,
    and the node with fewer did not get cheaper: its batches were smaller), and so are the
    shards another region's loss brings it. The control shard, in no region's home, by its
    number."""

    def __init__(self, shard_count: int, weights: Mapping[str, float]) -> None:
        # each shard's home region and the region it falls back to when its home is lost
        preferences = {s: [*rank_regions(s, weights), "", ""][:2] for s in range(shard_count)}
        dealt: dict[str, int] = {}
        self._rank: dict[int, int] = {}
        # a region's shards dealt in the order of their fallback region: those one region's
        # loss brings another are one run of turns, so they are dealt evenly too
        for shard in sorted(preferences, key=lambda s: (preferences[s], s)):
            home = preferences[shard][0]
            self._rank[shard] = dealt.get(home, 0)
            dealt[home] = self._rank[shard] + 1

    def slot(self, shard: int, node_count: int) -> int:
        return self._rank.get(shard, shard) % node_count

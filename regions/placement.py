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


def node_slot(shard: int, node_count: int) -> int:
    """Which of a region's ``node_count`` node slots leads ``shard`` while the region leads it:
    a stable hash, so a shard keeps its slot through every failover and failback of regions
    (the node holding that slot's lease leads it, ``eventlog.stores.region_lease``)."""
    if node_count == 1:
        return 0
    return stable_hash(f"slot/{shard}") % node_count

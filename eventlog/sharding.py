"""Conversation -> shard mapping. Stable across processes and Python versions (no hash())."""

from __future__ import annotations

import hashlib


def stable_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def shard_of(conversation_id: str, shard_count: int) -> int:
    if shard_count <= 0:
        raise ValueError("shard_count must be positive")
    return stable_hash(conversation_id) % shard_count

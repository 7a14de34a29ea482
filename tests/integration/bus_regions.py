"""Fresh replay regions for the Kafka tests (the topics and groups of one test never meet
another's) and the bus secret that signs their records (``replay.bus.codec``)."""

from __future__ import annotations

import uuid

BUS_SECRET = bytes(range(32))


class FreshRegions:
    """``fresh()`` hands out a new region; ``secrets`` already holds a key for each."""

    def __init__(self, prefix: str = "r", count: int = 64) -> None:
        self._names = [f"{prefix}{uuid.uuid4().hex[:10]}" for _ in range(count)]
        self.secrets = dict.fromkeys(self._names, BUS_SECRET)

    def fresh(self) -> str:
        return self._names.pop()

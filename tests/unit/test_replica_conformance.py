"""The replica conformance suite (tests/replica_conformance.py) on the reference MemoryReplica."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from eventlog.memory_replica import MemoryReplica
from eventlog.replica import ReplicaStore
from tests.replica_conformance import ReplicaConformance, ReplicaOpener


@pytest.fixture
async def replica_opener() -> AsyncIterator[ReplicaOpener]:
    memory = MemoryReplica("r1")

    async def make() -> ReplicaStore:
        return memory  # "reopening" the reference finds the same (durable) state

    opener = ReplicaOpener(make)
    yield opener
    await opener.close_all()


class TestReplicaConformance(ReplicaConformance):
    """The suite on MemoryReplica."""

"""A simulated network between leaders and replicas: delay, loss, duplication, reordering,
partitions and replica crashes, all drawn from one seeded rng."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from eventlog.errors import ReplicaUnavailable
from eventlog.identity import IdentityRecord
from eventlog.memory_replica import MemoryReplica
from eventlog.model import (
    AppendReply,
    ConversationSummary,
    LogEntry,
    PrepareReply,
    ShardStatus,
)
from eventlog.replica import ReplicaStore

T = TypeVar("T")

#: a lost message never gets a reply; callers' timeouts end the wait
_HANG_S = 3600.0


@dataclass
class NetworkFaults:
    delay_min_s: float = 0.001
    delay_max_s: float = 0.010
    drop_p: float = 0.0  # request or reply lost
    duplicate_p: float = 0.0  # request delivered twice (the second reply is lost)


class SimNetwork:
    def __init__(self, rng: random.Random, replicas: dict[str, MemoryReplica]) -> None:
        self.rng = rng
        self.replicas = replicas
        self.faults = NetworkFaults()
        self.cut: set[tuple[str, str]] = set()  # (from region, to region) pairs cut off
        self.crashed: set[str] = set()
        #: extra delay of every call to a region's database (a stalled or slow database)
        self.stalled_s: dict[str, float] = {}
        #: regions whose node process is paused: its calls are neither sent nor answered
        self.frozen: set[str] = set()
        self._background: list[asyncio.Task[object]] = []

    def link(self, src: str, dst: str) -> SimLink:
        return SimLink(self, src, dst)

    def partition(self, region: str) -> None:
        for other in self.replicas:
            if other != region:
                self.cut.add((region, other))
                self.cut.add((other, region))

    def heal(self) -> None:
        self.cut.clear()

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.cut and dst not in self.crashed

    async def deliver(self, src: str, dst: str, op: Callable[[], Awaitable[T]]) -> T:
        faults = self.faults
        await asyncio.sleep(self.rng.uniform(faults.delay_min_s, faults.delay_max_s))
        if src in self.frozen:
            await asyncio.sleep(_HANG_S)
        if not self.reachable(src, dst):
            raise ReplicaUnavailable(f"{dst} unreachable from {src}")
        if self.rng.random() < faults.drop_p:
            await asyncio.sleep(_HANG_S)
        if self.rng.random() < faults.duplicate_p:
            delay_s = self.rng.uniform(faults.delay_min_s, faults.delay_max_s * 3)
            self._background.append(asyncio.ensure_future(self._late_copy(dst, delay_s, op)))
        if dst in self.stalled_s:
            await asyncio.sleep(self.rng.uniform(0.0, self.stalled_s[dst]))
        result = await op()
        await asyncio.sleep(self.rng.uniform(faults.delay_min_s, faults.delay_max_s))
        if not self.reachable(dst, src) or src in self.frozen or self.rng.random() < faults.drop_p:
            await asyncio.sleep(_HANG_S)
        return result

    async def _late_copy(self, dst: str, delay_s: float, op: Callable[[], Awaitable[T]]) -> None:
        await asyncio.sleep(delay_s)
        if dst not in self.crashed:
            await op()

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


class SimLink(ReplicaStore):
    """The replica of ``dst`` as seen from a node in ``src``."""

    def __init__(self, network: SimNetwork, src: str, dst: str) -> None:
        self.region = dst
        self._net = network
        self._src = src
        self._replica = network.replicas[dst]

    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply:
        return await self._net.deliver(
            self._src, self.region, lambda: self._replica.prepare(shard, epoch, tail_max)
        )

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
    ) -> AppendReply:
        return await self._net.deliver(
            self._src,
            self.region,
            lambda: self._replica.append(
                shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn
            ),
        )

    async def status(self, shard: int) -> ShardStatus:
        return await self._net.deliver(self._src, self.region, lambda: self._replica.status(shard))

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        return await self._net.deliver(
            self._src, self.region, lambda: self._replica.read_log(shard, after_lsn, limit)
        )

    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        return await self._net.deliver(
            self._src,
            self.region,
            lambda: self._replica.read_conversation(
                shard, tenant_id, conversation_id, after_seq, limit, max_lsn
            ),
        )

    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        return await self._net.deliver(
            self._src,
            self.region,
            lambda: self._replica.list_conversations(shard, active_since_ms, max_lsn, limit),
        )

    async def identity(self) -> str:
        return await self._net.deliver(self._src, self.region, self._replica.identity)

    async def registry(self) -> dict[str, IdentityRecord]:
        return await self._net.deliver(self._src, self.region, self._replica.registry)

    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        await self._net.deliver(
            self._src, self.region, lambda: self._replica.record_identity(region, record)
        )

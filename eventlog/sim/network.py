"""A simulated network between leaders and replicas: delay, loss, duplication, reordering,
partitions and replica crashes, all drawn from one seeded rng."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from eventlog.errors import ReplicaUnavailable
from eventlog.memory_replica import MemoryReplica
from eventlog.replica import ReplicaStoreWrapper

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
        #: (node region, database region) links black-holed both ways, the others untouched:
        #: an asymmetric partition (node a cannot reach database b while node b reaches a)
        self.link_cut: set[tuple[str, str]] = set()
        self.crashed: set[str] = set()
        #: extra delay of every call to a region's database (a stalled or slow database)
        self.stalled_s: dict[str, float] = {}
        #: regions whose node process is paused: its calls are neither sent nor answered
        self.frozen: set[str] = set()
        self._background: list[asyncio.Task[object]] = []

    def link(self, src: str, dst: str, *, node: str | None = None) -> SimLink:
        """``dst``'s replica as a node of region ``src`` reaches it; ``node``: which of the
        region's nodes, when it has several (what ``frozen`` names; default: ``src``)."""
        return SimLink(self, src, dst, node=node)

    def partition(self, region: str) -> None:
        for other in self.replicas:
            if other != region:
                self.cut.add((region, other))
                self.cut.add((other, region))

    def heal(self) -> None:
        self.cut.clear()
        self.link_cut.clear()

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.cut and dst not in self.crashed

    async def deliver(
        self, src: str, dst: str, op: Callable[[], Awaitable[T]], *, node: str | None = None
    ) -> T:
        faults = self.faults
        frozen = node or src
        await asyncio.sleep(self.rng.uniform(faults.delay_min_s, faults.delay_max_s))
        if frozen in self.frozen or (src, dst) in self.link_cut:
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
        if (
            not self.reachable(dst, src)
            or frozen in self.frozen
            or (src, dst) in self.link_cut
            or self.rng.random() < faults.drop_p
        ):
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


class SimLink(ReplicaStoreWrapper):
    """The replica of ``dst`` as seen from a node in ``src``: every call crosses the simulated
    network, which may delay, lose, duplicate or cut it."""

    def __init__(self, network: SimNetwork, src: str, dst: str, *, node: str | None = None) -> None:
        super().__init__(network.replicas[dst])
        self._net = network
        self._src = src
        self._node = node

    async def around(self, call: str, read_only: bool, thunk: Callable[[], Awaitable[T]]) -> T:
        return await self._net.deliver(self._src, self.region, thunk, node=self._node)

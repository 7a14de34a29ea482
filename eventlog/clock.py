"""The clock port. Core code never calls time.* or asyncio.sleep directly; it gets a Clock.

Both implementations read the running event loop's clock for monotonic time, so the same core
code runs on a real loop (``SystemClock``) and on the simulator's virtual-time loop
(``eventlog.sim``), where ``sleep`` costs no real time.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod


class Clock(ABC):
    @abstractmethod
    def monotonic(self) -> float:
        """Seconds on a monotonic clock (only differences mean anything)."""

    @abstractmethod
    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (for timestamps shown to people)."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SystemClock(Clock):
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class LoopClock(Clock):
    """Time of the running event loop; wall time is ``start_wall_ms`` + loop time elapsed."""

    def __init__(self, start_wall_ms: int = 1_767_225_600_000) -> None:
        self._start_wall_ms = start_wall_ms

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_ms(self) -> int:
        return self._start_wall_ms + int(self.monotonic() * 1000)

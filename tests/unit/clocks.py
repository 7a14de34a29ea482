"""A clock for unit tests: time moves only when the test (or a fake it drives) moves it."""

from __future__ import annotations

import asyncio

from eventlog.clock import Clock

#: 2026-01-01T00:00:00Z, a wall-clock origin for tests that show timestamps
WALL_ORIGIN_MS = 1_767_225_600_000


class ManualClock(Clock):
    """``monotonic()`` is ``now_s``; ``wall_ms()`` is ``wall_base_ms`` + ``now_s`` in ms.

    With ``virtual_sleep`` (the default) a sleep moves ``now_s`` at once; without it a sleep is
    a real, short ``asyncio.sleep`` that leaves ``now_s`` alone (for timers inside code under
    test that must yield to the loop)."""

    def __init__(
        self, now_s: float = 0.0, *, wall_base_ms: int = 0, virtual_sleep: bool = True
    ) -> None:
        self.now_s = now_s
        self._wall_base_ms = wall_base_ms
        self._virtual_sleep = virtual_sleep

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return self._wall_base_ms + int(self.now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        if self._virtual_sleep:
            self.now_s += seconds
        else:
            await asyncio.sleep(seconds)

"""An asyncio event loop on virtual time: sleeping costs no real time, and with no real I/O the
order of every callback is a function of the program alone, so a seeded run replays exactly."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationDeadlock(RuntimeError):
    """Nothing is runnable and nothing is scheduled: the simulated system hangs."""


class _VirtualSelector(selectors.BaseSelector):
    """Never reports I/O; ``select(timeout)`` advances the virtual clock by ``timeout``."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(
            fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data
        )
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationDeadlock("no runnable task and no timer: the simulation hangs")
        self.now_s += max(timeout, 0.0)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(selector=self._virtual)

    def time(self) -> float:
        return self._virtual.now_s


def run_on_virtual_time(coro: Coroutine[Any, Any, T]) -> T:
    """``coro``'s result, run to its end on a fresh ``VirtualTimeLoop``; the tasks it left
    behind are cancelled before the loop closes."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

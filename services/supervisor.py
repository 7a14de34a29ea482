"""Supervised background loops: a crash stops only the step it hit, and everyone can see it.

A node's background work (probing, learning the placement, leading the control shard, ...) runs
as loops of one ``step`` each. Expected trouble (a ``ConvplaneError``: no quorum, a replica or
peer that does not answer) is an ordinary outcome of a step, logged and retried next period.
Anything else is a bug (``InvariantViolation``) or an unexpected failure: the supervisor logs it
with its traceback, counts it, and runs the loop again after a jittered, doubling backoff
(``restart_backoff_min_s`` .. ``restart_backoff_max_s``), so one bad record or one bad reply does
not silently end failure detection for the life of the process. A loop that crashed
``crash_loop_after`` times in a row without a clean step in between is *crash-looping*: it shows
in ``/healthz`` (status ``degraded``), in ``GET /v1/regions`` and in the metrics
(``convplane_background_loop_crash_looping``), which is what an alert watches.

The clock and the rng are injected, so the simulator runs supervised loops on virtual time.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from eventlog.backoff import Backoff, jittered
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError

log = logging.getLogger("convplane.supervisor")

Step = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    restart_backoff_min_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    #: consecutive crashes (no clean step between) that make a loop "crash-looping"
    crash_loop_after: int = 3


@dataclass(slots=True)
class LoopHealth:
    name: str
    steps_ok: int = 0
    crashes: int = 0
    consecutive_crashes: int = 0
    last_error: str | None = None
    running: bool = True

    def crash_looping(self, limits: SupervisorConfig) -> bool:
        return self.consecutive_crashes >= limits.crash_loop_after

    def to_body(self, limits: SupervisorConfig) -> dict[str, object]:
        return {
            "name": self.name,
            "running": self.running,
            "crash_looping": self.crash_looping(limits),
            "crashes": self.crashes,
            "last_error": self.last_error,
        }


#: failures that are outcomes of a step, not crashes: retried at the loop's own period
EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    ConvplaneError,
    httpx.HTTPError,
    OSError,
    TimeoutError,
)


class Supervisor:
    def __init__(
        self, *, clock: Clock, rng: random.Random, limits: SupervisorConfig | None = None
    ) -> None:
        self._clock = clock
        self._rng = rng
        self.limits = limits or SupervisorConfig()
        self._loops: dict[str, LoopHealth] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, step: Step, period_s: float) -> asyncio.Task[None]:
        """Run ``step`` every ``period_s`` (jittered +-20%) until ``close``."""
        health = self._loops.setdefault(name, LoopHealth(name))
        task = asyncio.create_task(self._run(health, step, period_s), name=name)
        self._tasks.append(task)
        return task

    def loops(self) -> list[LoopHealth]:
        return list(self._loops.values())

    def unhealthy(self) -> list[str]:
        """Loops that stopped or are crash-looping."""
        return sorted(
            h.name for h in self._loops.values() if not h.running or h.crash_looping(self.limits)
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, health: LoopHealth, step: Step, period_s: float) -> None:
        backoff = Backoff(
            self.limits.restart_backoff_min_s, self.limits.restart_backoff_max_s, self._rng
        )
        try:
            while True:
                try:
                    await step()
                    health.steps_ok += 1
                    health.consecutive_crashes = 0
                    backoff.reset()
                except EXPECTED_FAILURES as exc:
                    log.warning("%s: %s", health.name, exc)
                except Exception as exc:  # the supervisor is the boundary: log, count, restart
                    health.crashes += 1
                    health.consecutive_crashes += 1
                    health.last_error = f"{type(exc).__name__}: {exc}"[:500]
                    log.exception(
                        "%s crashed (%d in a row); restarting",
                        health.name,
                        health.consecutive_crashes,
                    )
                    await self._clock.sleep(backoff.next_s())
                    continue
                await self._clock.sleep(jittered(period_s, self._rng, low=0.8, width=0.4))
        finally:
            health.running = False

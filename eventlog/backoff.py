"""Jittered, doubling, capped delays: the one way every retry and poll loop in the plane waits.

Randomness comes from the caller's ``random.Random`` (the simulator seeds it), one draw per
delay, so a seeded run replays exactly.
"""

from __future__ import annotations

import random


def jittered(delay_s: float, rng: random.Random, low: float = 0.5, width: float = 1.0) -> float:
    """``delay_s`` times a factor drawn uniformly from ``[low, low + width)``: the default spreads
    it over [0.5, 1.5) times ``delay_s``, so retries of many callers do not line up."""
    return delay_s * (low + width * rng.random())


class Backoff:
    """A retry's wait: starts at ``min_s``, doubles after every wait up to ``max_s``, each wait
    jittered (``jittered``); ``reset`` after a success."""

    def __init__(
        self, min_s: float, max_s: float, rng: random.Random, low: float = 0.5, width: float = 1.0
    ) -> None:
        self._min_s = min_s
        self._max_s = max_s
        self._rng = rng
        self._low = low
        self._width = width
        self.current_s = min_s

    def next_s(self) -> float:
        """The wait now, and double the next one."""
        delay_s = jittered(self.current_s, self._rng, self._low, self._width)
        self.current_s = min(self.current_s * 2, self._max_s)
        return delay_s

    def reset(self) -> None:
        self.current_s = self._min_s

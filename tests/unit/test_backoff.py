"""The one jittered, doubling, capped delay (eventlog.backoff)."""

from __future__ import annotations

import random

from eventlog.backoff import Backoff, jittered


class Fixed(random.Random):
    """A generator that always draws ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_jitter_spreads_a_delay_over_its_range() -> None:
    assert jittered(2.0, Fixed(0.0)) == 1.0 and jittered(2.0, Fixed(0.5)) == 2.0
    assert jittered(2.0, Fixed(0.5), low=0.75, width=0.5) == 2.0
    assert jittered(2.0, Fixed(0.0), low=0.75, width=0.5) == 1.5


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.1, 0.5, Fixed(0.5))  # factor 1.0: the waits show the steps
    assert [round(backoff.next_s(), 6) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next_s() == 0.1


def test_one_draw_per_wait_so_seeded_runs_replay() -> None:
    backoff, rng = Backoff(1.0, 8.0, random.Random(7)), random.Random(7)
    waits = [backoff.next_s() for _ in range(6)]
    assert waits == [d * (0.5 + rng.random()) for d in (1.0, 2.0, 4.0, 8.0, 8.0, 8.0)]

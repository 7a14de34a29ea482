"""The plane's own availability SLO and how fast its error budget burns. Pure: no I/O, no clock.

The SLO is the share of the plane's live appends (client appends only, never a drill's canary)
answered without a 5xx; 4xx answers are the client's own and count neither way. Its error
budget is ``1 - slo``. The **burn rate** over a window is the error ratio divided by that
budget: 1 spends the budget exactly as fast as the SLO allows, 14.4 spends 2 % of a 30-day
budget in an hour (the classic fast-burn page).

The counts come from the nodes' own counters as the drills read them
(``services.control.drills.load.plane_load``): each ``LoadSample`` is the plane's live appends
answered 2xx and 5xx per second at one moment. Between two samples the later one's rates stand
for the time since the earlier one, so the window's appends are the sum of rate x interval over
consecutive samples inside it (the first sample only marks a start). The burn is not judged
(None) with fewer than ``min_appends`` ended appends in the window (a handful of errors on an
idle plane says nothing about its budget), nor while the samples span less than
``COVERAGE_MIN`` of the window: a control leader that just took over (a region-loss drill can
move it) would otherwise judge a drill's few seconds of failover errors over a minute of
samples, not over the window the budget is set for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from eventlog.errors import InvariantViolation

#: the share of the window the samples must span before the burn is judged
COVERAGE_MIN = 0.5


@dataclass(frozen=True, slots=True)
class BurnPolicy:
    #: the share of live appends answered without a 5xx, in (0, 1)
    slo_availability: float
    #: the window the burn is measured over (s)
    window_s: float
    #: a burn above this blocks a start and aborts a running practice drill
    rate_max: float
    #: fewer ended live appends than this in the window: not judged
    min_appends: int

    def __post_init__(self) -> None:
        if not 0.0 < self.slo_availability < 1.0:
            raise InvariantViolation("the availability SLO must be between 0 and 1, exclusive")


@dataclass(frozen=True, slots=True)
class LoadSample:
    at_s: float
    succeeded_per_s: float
    errors_per_s: float


@dataclass(frozen=True, slots=True)
class Burn:
    #: error ratio / (1 - slo)
    rate: float
    error_ratio: float
    #: the live appends that ended (2xx or 5xx) in the window, as counted from the samples
    appends: float

    def reason(self, policy: BurnPolicy) -> str:
        return (
            f"error budget burning at {self.rate:.1f}x (max {policy.rate_max:g}x, SLO "
            f"{policy.slo_availability:.4%}): {self.error_ratio:.3%} of {self.appends:.0f} "
            f"live appends answered 5xx over {policy.window_s:g} s"
        )


def burn(samples: Sequence[LoadSample], now_s: float, policy: BurnPolicy) -> Burn | None:
    """The burn over the ``policy.window_s`` up to ``now_s``; None below ``min_appends`` or
    while the samples span less than ``COVERAGE_MIN`` of the window."""
    inside = [s for s in samples if now_s - policy.window_s <= s.at_s <= now_s]
    if not inside or inside[-1].at_s - inside[0].at_s < COVERAGE_MIN * policy.window_s:
        return None
    succeeded = errors = 0.0
    for before, after in pairwise(inside):
        interval_s = after.at_s - before.at_s
        succeeded += after.succeeded_per_s * interval_s
        errors += after.errors_per_s * interval_s
    ended = succeeded + errors
    if ended <= 0.0 or ended < policy.min_appends:
        return None
    ratio = errors / ended
    return Burn(ratio / (1.0 - policy.slo_availability), ratio, ended)


def burning(samples: Sequence[LoadSample], now_s: float, policy: BurnPolicy) -> Burn | None:
    """The burn when it is over ``policy.rate_max``, else None."""
    found = burn(samples, now_s, policy)
    return found if found is not None and found.rate > policy.rate_max else None

"""The priority probe's verdict (``replay.engines.vllm_check.judge_queue``) on timings measured
from the CPU vLLM 0.32 in this repository's real-vLLM tier: seconds after the live-priority
prompt was sent, when it and each replay-priority prompt queued before it were answered; the
short prompt's round trip alone was 12-20 ms there."""

from __future__ import annotations

import pytest

from replay.engines.vllm_check import judge_queue

#: --scheduling-policy priority, 8 prompts of 1,900 tokens: answered in the second step
PRIORITY = (0.108, [0.035, 0.107, 0.175, 0.243, 0.31, 0.38, 0.425])
#: vLLM's default FCFS, the same queue: answered with the last of them
FCFS = (0.436, [0.024, 0.096, 0.169, 0.242, 0.313, 0.389, 0.436])
#: priority, 8 prompts of 1,000 tokens (two a step): answered in the third of four steps
TOO_CLOSE = (0.142, [0.014, 0.014, 0.074, 0.074, 0.142, 0.143, 0.169])
ROUND_TRIP = 0.015


def test_a_live_prompt_answered_while_the_queue_still_waits_passes() -> None:
    assert judge_queue(*PRIORITY, ROUND_TRIP) == "passed"


def test_a_live_prompt_answered_with_the_last_of_the_queue_fails() -> None:
    assert judge_queue(*FCFS, ROUND_TRIP) == "failed"
    assert judge_queue(0.430, FCFS[1], ROUND_TRIP) == "failed"  # a few ms before the last: one step


def test_timings_in_between_cannot_tell() -> None:
    assert judge_queue(*TOO_CLOSE, 0.005) == "unverified"


@pytest.mark.parametrize(
    "queued",
    [
        [],  # nothing was still queued when the live prompt joined
        [0.05, 0.051, 0.052, 0.053],  # every queued prompt answered in one step
        [0.05, 0.051, 0.1, 0.101],  # two steps: too few to tell a priority scheduler
    ],
)
def test_a_queue_that_drained_in_fewer_than_four_steps_cannot_tell(queued: list[float]) -> None:
    assert judge_queue(0.2, queued, 0.001) == "unverified"
    assert judge_queue(0.001, queued, 0.001) == "unverified"


def test_one_overtaken_prompt_is_not_enough_to_pass() -> None:
    queued = [0.01, 0.03, 0.05, 0.062, 0.1]  # five steps
    assert judge_queue(0.055, queued, 0.001) == "unverified"  # 0.062 is within the tie
    assert judge_queue(0.03, queued, 0.001) == "passed"


def test_a_queue_that_drained_at_the_pace_of_round_trips_cannot_tell() -> None:
    """An engine that prefilled the whole queue before the live prompt reached it: the answers
    come back in the order the server sends them, the live prompt's last, whatever the
    scheduler. The same timings on a slower engine are judged."""
    queued = [0.005, 0.011, 0.017, 0.023, 0.029, 0.035, 0.041, 0.047, 0.052]
    assert judge_queue(0.052, queued, 0.003) == "unverified"  # 9 round trips take 0.054 s
    assert judge_queue(0.052, queued, 0.002) == "failed"

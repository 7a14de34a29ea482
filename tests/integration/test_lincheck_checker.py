"""The Porcupine checker (tests/lincheck) on hand-made histories: it accepts what the API
promises and rejects each way a plane could break it, so a pass on a recorded history means
something.

Times below are nanoseconds; ``None`` as a return is an append whose outcome is unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.lincheck.checker import check_history

BASE = 0  # last_seq right after creation: appends get 1, 2, ...


def append(client: int, key: str, call: int, ret: int | None, seq: int = 0) -> dict[str, Any]:
    return {"client": client, "conversation": "c", "op": "append", "key": key, "call": call,
            "return": ret, "seq": seq}  # fmt: skip


def read(client: int, keys: list[str], call: int, ret: int) -> dict[str, Any]:
    return {"client": client, "conversation": "c", "op": "read", "call": call, "return": ret,
            "keys": keys, "seqs": list(range(BASE + 1, BASE + 1 + len(keys)))}  # fmt: skip


def last(client: int, last_seq: int, call: int, ret: int) -> dict[str, Any]:
    return {"client": client, "conversation": "c", "op": "last", "call": call, "return": ret,
            "last_seq": last_seq}  # fmt: skip


def verdict(binary: Path, tmp_path: Path, operations: list[dict[str, Any]]) -> int:
    history = tmp_path / "history.json"
    history.write_text(json.dumps({"conversations": {"c": BASE}, "operations": operations}))
    result = check_history(binary, history, tmp_path / "history.html")
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code


def test_concurrent_appends_and_reads_that_agree_are_linearizable(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [
        append(0, "a", 0, 10, seq=2),  # concurrent with b: either order is fine
        append(1, "b", 1, 9, seq=1),
        read(2, ["b"], 2, 5),  # overlaps both appends: may see b alone
        read(2, ["b", "a"], 11, 12),
        last(1, 2, 13, 14),
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 0


def test_a_read_missing_an_acknowledged_append_is_rejected(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [append(0, "a", 0, 5, seq=1), read(1, [], 6, 7)]  # a stale read after the ack
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def test_a_read_that_goes_back_in_time_is_rejected(lincheck_binary: Path, tmp_path: Path) -> None:
    ops = [
        append(0, "a", 0, 100, seq=1),
        read(1, ["a"], 1, 2),  # sees a (it may: a is in flight)
        read(1, [], 3, 4),  # then a later read does not: a deposed leader's answer
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def test_a_last_seq_counting_an_entry_that_never_commits_is_rejected(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [
        append(0, "a", 0, 5, seq=1),
        last(1, 2, 6, 7),  # says two events exist
        read(1, ["a"], 8, 9),  # but the log holds one
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def test_an_idempotent_retry_must_return_the_original_seq(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    good = [append(0, "a", 0, 5, seq=1), append(1, "b", 6, 7, seq=2), append(0, "a", 8, 9, seq=1)]
    assert verdict(lincheck_binary, tmp_path, good) == 0
    duplicated = [*good[:2], append(0, "a", 8, 9, seq=3)]  # the retry became a new event
    assert verdict(lincheck_binary, tmp_path, duplicated) == 1


def test_a_gap_or_a_reordered_transcript_is_rejected(lincheck_binary: Path, tmp_path: Path) -> None:
    ops = [append(0, "a", 0, 5, seq=1), append(0, "b", 6, 7, seq=2)]
    gap = [*ops, {**read(1, ["a", "b"], 8, 9), "seqs": [1, 3]}]
    assert verdict(lincheck_binary, tmp_path, gap) == 1
    reordered = [*ops, read(1, ["b", "a"], 8, 9)]
    assert verdict(lincheck_binary, tmp_path, reordered) == 1


@pytest.mark.parametrize("seen", [True, False])
def test_an_append_of_unknown_outcome_may_or_may_not_have_committed(
    lincheck_binary: Path, tmp_path: Path, seen: bool
) -> None:
    ops = [append(0, "a", 0, None), read(1, ["a"] if seen else [], 10, 11)]
    assert verdict(lincheck_binary, tmp_path, ops) == 0
    # ... but once a read saw it, it cannot disappear
    ops = [append(0, "a", 0, None), read(1, ["a"], 10, 11), read(1, [], 12, 13)]
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def effect(client: int, attempt: str, status: str, call: int, ret: int | None, *,
           seq: int = 0, conflict: bool = False) -> dict[str, Any]:  # fmt: skip
    return {"client": client, "conversation": "c", "op": "effect", "attempt": attempt,
            "status": status, "call": call, "return": ret, "seq": seq,
            "conflict": conflict}  # fmt: skip


def status(client: int, attempt: str, state: str, call: int, ret: int) -> dict[str, Any]:
    return {"client": client, "conversation": "c", "op": "status", "attempt": attempt,
            "state": state, "call": call, "return": ret}  # fmt: skip


def test_racing_effects_one_wins_and_the_attempts_status_shows_it(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [
        append(0, "att:t1", 0, 5, seq=1),
        status(1, "t1", "pending", 6, 7),
        effect(0, "t1", "committed", 8, 20, seq=2),
        effect(1, "t1", "failed", 9, 19, conflict=True),  # the loser is refused
        effect(2, "t1", "committed", 21, 22, seq=2),  # an identical repeat: the original
        status(1, "t1", "committed", 23, 24),
        read(2, ["att:t1", "eff:t1:committed"], 25, 26),
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 0


def test_two_committed_effects_for_one_attempt_are_rejected(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [
        append(0, "att:t1", 0, 5, seq=1),
        effect(0, "t1", "committed", 8, 20, seq=2),
        effect(1, "t1", "failed", 9, 19, seq=3),  # both acknowledged: two effects
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def test_a_status_read_that_misses_a_committed_effect_is_rejected(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    """Bug 3 of the whole-plane issue: a deposed leader said pending after the new leader had
    committed the effect, and the README tells applications to re-run the tool then."""
    ops = [
        append(0, "att:t1", 0, 5, seq=1),
        effect(0, "t1", "committed", 6, 7, seq=2),
        status(1, "t1", "pending", 8, 9),
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 1


def test_an_effect_of_unknown_outcome_may_commit_and_then_wins_over_a_later_one(
    lincheck_binary: Path, tmp_path: Path
) -> None:
    ops = [
        append(0, "att:t1", 0, 5, seq=1),
        effect(0, "t1", "committed", 6, None),  # timed out
        effect(1, "t1", "failed", 10, 11, conflict=True),  # so it had committed
        status(1, "t1", "committed", 12, 13),
    ]
    assert verdict(lincheck_binary, tmp_path, ops) == 0
    refused_for_nothing = [*ops[:1], effect(1, "t1", "failed", 10, 11, conflict=True)]
    assert verdict(lincheck_binary, tmp_path, refused_for_nothing) == 1

"""What makes a local plane the same plane after a stop (``services.local.plane_state``): the
saved plane round-trips, and every argument that would make another plane is named."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from services.local.plane_state import (
    PlaneState,
    RequestedPlane,
    SavedDatabase,
    SavedEngines,
    SavedRegion,
    conflicts,
    load_state,
    state_json,
)

SAVED = PlaneState(
    postgres=True, tls=True, shard_count=16, host="127.0.0.1", api_key="cp_a",
    limited_api_key="cp_b", operator_api_key="cp_c", viewer_api_key="cp_d",
    regions=(
        SavedRegion("us-east", 8700, 8800, "pw-node-1", SavedDatabase("pg0", 15001, "pw0", True)),
        SavedRegion("eu-west", 8701, 8801, "pw-node-2", SavedDatabase("pg1", 15002, "pw1", True)),
    ),
)  # fmt: skip
SAME = RequestedPlane(regions=2, postgres=True, tls=True, shard_count=16, host="127.0.0.1",
                      base_port=8700)  # fmt: skip


def test_a_saved_plane_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "plane-state.json"
    path.write_text(json.dumps(state_json(SAVED)))
    assert load_state(path) == SAVED
    assert load_state(tmp_path / "missing.json") is None
    engines = SavedEngines(
        ("us-east=http://10.0.0.5:8000",), True, "127.0.0.1:9092", {"us-east": "cpw_k"},
        {"us-east": "ab" * 32}, "cd" * 32,
    )  # fmt: skip
    path.write_text(json.dumps(state_json(replace(SAVED, engines=engines))))
    assert load_state(path) == replace(SAVED, engines=engines)


def test_a_plane_without_engines_is_written_as_before_engines_were_saved(tmp_path: Path) -> None:
    """No ``engines`` key: older versions read it, and read files they wrote."""
    assert "engines" not in state_json(SAVED)
    path = tmp_path / "plane-state.json"
    path.write_text(json.dumps(state_json(SAVED)))
    assert load_state(path) == SAVED and SAVED.engines is None


@pytest.mark.parametrize("text", ["{", '{"version": 99}', '{"version": 1, "regions": []}'])
def test_a_state_file_this_version_did_not_write_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plane-state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"plane-state\.json"):
        load_state(path)


def test_the_same_arguments_conflict_with_nothing() -> None:
    assert conflicts(SAVED, SAME) == []
    assert conflicts(SAVED, replace(SAME, base_port=0)) == []  # any port: the saved ones


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"regions": 3}, "--regions 3, it has 2"),
        ({"postgres": False}, "SQLite replicas asked, it has PostgreSQL ones"),
        ({"tls": False}, "--no-tls"),
        ({"shard_count": 64}, "--shard-count 64, it has 16"),
        ({"host": "0.0.0.0"}, "host 0.0.0.0"),
        ({"base_port": 9000}, "--base-port 9000, its first region is on 8700"),
    ],
)
def test_each_argument_of_another_plane_is_named(change: dict[str, object], named: str) -> None:
    found = conflicts(SAVED, replace(SAME, **change))  # type: ignore[arg-type]
    assert len(found) == 1 and named in found[0], found

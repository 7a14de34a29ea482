"""Which engines ``convplane up`` attaches (``services.cli.up._engines_requested``): the ones
given, else the saved plane's (its declaration and broker unless given again), else none; and
the combinations it refuses before anything is probed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.cli.up import _engines_requested
from services.local.plane import PlaneError
from services.local.plane_state import PlaneState, SavedEngines, SavedRegion

ENGINES = SavedEngines(
    ("eu-west=http://10.0.0.5:8000",), True, "127.0.0.1:9092", {"eu-west": "cpw_k"},
    {"eu-west": "ab" * 32}, "cd" * 32,
)  # fmt: skip
SAVED = PlaneState(
    postgres=False, tls=True, shard_count=16, host="127.0.0.1", api_key="cp_a",
    limited_api_key="cp_b", operator_api_key="cp_c", viewer_api_key="cp_d",
    regions=(SavedRegion("us-east", 8700, 8800, "pw1", None),), engines=ENGINES,
)  # fmt: skip


def test_a_plain_up_takes_the_saved_engines_with_their_declaration_and_broker() -> None:
    got = _engines_requested([], False, False, "", 0, SAVED)
    assert got.resumed and got.options == list(ENGINES.options) and got.saved == ENGINES
    assert got.priority_declared and got.kafka_bootstrap_servers == "127.0.0.1:9092"
    moved = _engines_requested([], False, False, "127.0.0.1:9999", 0, SAVED)
    assert moved.kafka_bootstrap_servers == "127.0.0.1:9999"  # a broker that moved


def test_engines_given_replace_the_saved_ones_but_keep_their_secrets() -> None:
    got = _engines_requested(["us-east=http://h:1"], False, False, "", 0, SAVED)
    assert not got.resumed and got.options == ["us-east=http://h:1"] and got.saved == ENGINES
    assert not got.priority_declared and got.kafka_bootstrap_servers == ""


def test_without_engines_resumes_with_none() -> None:
    got = _engines_requested([], True, False, "", 0, SAVED)
    assert got.options == [] and not got.resumed


def test_no_saved_plane_or_no_saved_engines_means_only_what_is_given() -> None:
    for saved in (None, replace(SAVED, engines=None)):
        got = _engines_requested([], False, False, "", 2, saved)
        assert got.options == [] and not got.resumed and got.saved is None


@pytest.mark.parametrize(
    ("options", "without", "sim_engines", "said"),
    [
        (["eu-west=http://h:1"], True, 0, "--engine and --without-engines"),
        ([], False, 2, "resume it with --without-engines"),
    ],
)
def test_contradictions_are_refused_before_any_engine_is_asked(
    options: list[str], without: bool, sim_engines: int, said: str
) -> None:
    with pytest.raises(PlaneError, match=said):
        _engines_requested(options, without, False, "", sim_engines, SAVED)

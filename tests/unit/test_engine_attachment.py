"""Attaching engines to a plane: ``convplane up --engine REGION=URL`` options are validated before
any engine is asked, and an engine's declared priority scheduling (``EngineConfig``) reaches its
in-node worker, which then takes the whole spare instead of the unverified share."""

from __future__ import annotations

import pytest

from services.local.attached_engines import EngineOption, EngineRefused, parse_engine_options
from services.replay.config import EngineConfig
from tests.unit.replay_world import REVISION, replay_config, world

REGIONS = ("us-east", "eu-west", "ap-south")


def test_engine_options_name_a_region_of_the_plane_and_a_base_url() -> None:
    parsed = parse_engine_options(
        ["us-east=http://127.0.0.1:8000/", " eu-west = https://vllm.internal/v1base "], REGIONS
    )
    assert parsed == [
        EngineOption("us-east", "http://127.0.0.1:8000"),
        EngineOption("eu-west", "https://vllm.internal/v1base"),
    ]


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("http://127.0.0.1:8000", "expected REGION=URL"),
        ("us-central=http://127.0.0.1:8000", "no region 'us-central' in this plane"),
        ("us-east=127.0.0.1:8000", "not an http(s) URL with a host"),
        ("us-east=http://", "not an http(s) URL with a host"),
        ("us-east=http://h:1/?model=x", "no query or fragment"),
    ],
)
def test_a_bad_engine_option_is_refused_saying_what_was_expected(option: str, said: str) -> None:
    with pytest.raises(EngineRefused, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse_engine_options([option], REGIONS)


def test_the_same_engine_twice_for_one_region_is_refused() -> None:
    with pytest.raises(EngineRefused, match="given twice"):
        parse_engine_options(["us-east=http://h:1", "us-east=http://h:1/"], REGIONS)


@pytest.mark.parametrize("declared", [True, False])
async def test_a_declared_priority_scheduling_reaches_the_in_node_worker(declared: bool) -> None:
    engine = EngineConfig(url="http://sim-b0.test", model_revision=REVISION, engine_id="b-e0",
                          priority_scheduling_declared=declared)  # fmt: skip
    async with world(replay_config(engines={"b": [engine]})) as w:
        (worker,) = w.service.workers
        assert worker.settings.priority_declared is declared


def test_priority_scheduling_is_undeclared_unless_the_operator_says_so() -> None:
    assert EngineConfig(url="http://e", model_revision="m").priority_scheduling_declared is False

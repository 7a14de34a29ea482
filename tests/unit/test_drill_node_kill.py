"""A kill drill of one node of a region of several (``DrillSpec.node``), pure: what the spec
accepts, which shards it measures, where the dry run says they go, which canary counts as
served elsewhere, and how the verdict and the report judge whether the death stayed inside its
region (the placement's version unchanged)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eventlog.errors import InvalidRequest
from regions.control import Placement
from regions.drill_plan import LiveLoad, preflight
from regions.drill_report import report, summary_lines
from regions.drills import Drill, DrillSpec, Observation, advance, shards_taken, start
from regions.ops_state import Halt
from regions.placement import SlotMap
from services.control.drills.canary import served_elsewhere

T0 = 1_767_225_600_000
REGIONS = {"ap-south": 1.0, "eu-west": 1.0, "us-east": 1.0}
#: us-east leads 0, 1, 4, 5 (``place_shards``): its slots of two deal them in turn (``SlotMap``)
ASSIGNMENT = {0: "us-east", 1: "us-east", 2: "ap-south", 3: "eu-west", 4: "us-east", 5: "us-east"}
NODE_1_SHARDS = [0, 5]
SLOTS = SlotMap(len(ASSIGNMENT), REGIONS)


def node_kill(**kw: object) -> DrillSpec:
    fields: dict[str, object] = {"kind": "kill", "region": "us-east", "hold_s": 10.0,
                                 "reason": "one node", "node": 1}  # fmt: skip
    fields.update(kw)
    return DrillSpec(**fields)  # type: ignore[arg-type]


def test_the_slot_shards_are_those_the_slot_map_gives_the_node() -> None:
    assert [SLOTS.slot(s, 2) for s in (0, 1, 4, 5)] == [1, 0, 0, 1]
    assert shards_taken(node_kill(), [5, 4, 1, 0], 2, SLOTS) == NODE_1_SHARDS
    assert shards_taken(node_kill(node=None), [5, 4, 1, 0], 2, SLOTS) == [0, 1, 4, 5]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "region-loss"}, "node applies to kill drills only"),
        ({"kind": "evacuate"}, "node applies to kill drills only"),
        ({"node": -1}, "node must be 0 or more"),
    ],
)
def test_a_node_only_goes_with_a_kill(fields: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        node_kill(**fields)


def test_the_node_must_be_one_the_region_runs_of_several() -> None:
    node_kill().check_node(2)
    node_kill(node=0).check_node(2)
    node_kill(node=None).check_node(1)  # a region's kill: any region
    with pytest.raises(InvalidRequest, match="us-east runs one node"):
        node_kill(node=0).check_node(1)
    with pytest.raises(InvalidRequest, match="runs nodes 0 to 1: no node 2"):
        node_kill(node=2).check_node(2)


def test_the_node_round_trips_and_a_regions_drill_record_stays_as_it_was() -> None:
    drill = start("d1", node_kill(), T0)
    assert Drill.from_body(json.loads(json.dumps(drill.to_body()))) == drill
    assert "node" not in start("d2", node_kill(node=None), T0).to_body()["spec"]


def plan_for(spec: DrillSpec, assignment: dict[int, str]) -> list[str]:
    plan = preflight(
        spec,
        statuses=dict.fromkeys(REGIONS, "up"),
        weights=REGIONS,
        placement=Placement(3, assignment, frozenset(), frozenset(), "t"),
        active=[],
        halt=Halt(on=False, reason="", by="", at_ms=0),
        load=LiveLoad(append_rate_per_s=10.0, region_append_capacity_per_s=2000.0),
        kill_supported=True,
        node_count=2,
    )
    assert all(region == "us-east" for region in plan.moves.values())
    return list(plan.failures)


def test_the_dry_run_keeps_the_nodes_shards_in_their_region() -> None:
    assert plan_for(node_kill(), ASSIGNMENT) == []
    without_slot_1 = {s: ("eu-west" if s in NODE_1_SHARDS else r) for s, r in ASSIGNMENT.items()}
    assert plan_for(node_kill(), without_slot_1) == [
        "us-east node 1 leads no shard: a kill of it measures nothing"
    ]


def test_only_a_canary_served_by_another_node_counts_as_recovered() -> None:
    killed, region = start("d1", node_kill(), T0), start("d2", node_kill(node=None), T0)
    assert not served_elsewhere(killed, "us-east/1")
    assert served_elsewhere(killed, "us-east")  # its sibling, node 0
    assert served_elsewhere(killed, "eu-west")
    assert not served_elsewhere(region, "us-east") and not served_elsewhere(region, "us-east/1")
    assert served_elsewhere(region, "eu-west/1")


def ended(versions: dict[str, int]) -> Drill:
    """A node kill through every phase, its slot shards recovered, nothing lost, the placement
    at ``versions``."""
    drill = start("d1", node_kill(), T0)
    measured = replace(
        drill.measurements,
        shards_moved=tuple(NODE_1_SHARDS),
        rto_s=dict.fromkeys(NODE_1_SHARDS, 0.8),
        placement_versions=versions,
    )
    drill = replace(drill, measurements=measured)
    holding = advance(drill, Observation(now_ms=T0 + 300, injected=True, injected_at_ms=T0))
    assert holding is not None
    restoring = advance(holding, Observation(now_ms=T0 + 10_000))
    assert restoring is not None and restoring.phase == "restoring"
    done = advance(restoring, Observation(now_ms=T0 + 11_000, restored=True, canary_lost=0))
    assert done is not None
    return done


def test_a_node_kill_that_left_the_placement_alone_passes_and_says_so() -> None:
    done = ended({"before": 3, "during": 3, "after": 3})
    assert (done.phase, done.verdict) == ("done", "passed")
    body = report(done)
    assert body["node"] == 1 and body["stayed_in_region"] is True and body["canary_lost"] == 0
    assert body["rto_by_shard_s"] == {"0": 0.8, "5": 0.8}
    lines = summary_lines(body)
    assert lines[0].startswith("drill d1: kill of us-east node 1 -> passed")
    assert (
        "  placement unchanged, no shard left the region (before v3, during v3, after v3)" in lines
    )


def test_a_node_kill_that_moved_shards_to_another_region_fails() -> None:
    done = ended({"before": 3, "during": 4, "after": 4})
    assert (done.phase, done.verdict) == ("failed", "failed")
    assert "the node's death did not stay inside us-east" in done.verdict_reason
    assert report(done)["stayed_in_region"] is False


def test_a_regions_report_says_nothing_of_staying_inside_it() -> None:
    body = report(start("d1", node_kill(node=None), T0))
    assert body["node"] is None and body["stayed_in_region"] is None

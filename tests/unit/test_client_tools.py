"""``run_tool_once`` and the tool helpers: a tool's side effect happens at most once, across
lost answers, failovers and a second run of the same attempt."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from convplane_client import (
    Conflict,
    ToolFailed,
    TransportFailed,
    argument_digest,
)
from tests.unit.test_client_fake_plane import FakePlane, VirtualClock


class ExternalSystem:
    """The tool's side of the world: counts how often each idempotency key ran it."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def charge(self, key: str) -> dict[str, Any]:
        self.runs.append(key)
        return {"charged": 5, "key": key}


def test_run_tool_once_records_runs_and_commits() -> None:
    plane, tool = FakePlane(), ExternalSystem()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        run = client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
        attempt = client.tool_attempt("c1", "call_1")
    assert tool.runs == ["call_1"]  # attempt_id is the external idempotency key
    assert (run.state, run.result, run.ran) == ("committed", {"charged": 5, "key": "call_1"}, True)
    assert attempt.state == "committed"
    recorded = [(e["type"], e["payload"]) for e in plane.events["c1"]]
    assert recorded == [
        ("tool.attempt", {"attempt_id": "call_1", "tool": "charge",
                          "argument_digest": argument_digest({"amount": 5})}),
        ("tool.effect", {"attempt_id": "call_1", "status": "committed", "result": run.result}),
    ]  # fmt: skip


def test_a_second_run_returns_the_recorded_effect_without_running() -> None:
    plane, tool = FakePlane(), ExternalSystem()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        first = client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
        second = client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
    assert tool.runs == ["call_1"]
    assert (second.ran, second.result) == (False, first.result)


def test_the_tool_runs_once_when_the_effect_answer_is_lost_in_a_failover() -> None:
    """The effect commits at the leader, its answer is lost and the leader's region dies: the
    client sends the same effect to another region, which answers with the original."""
    plane, tool = FakePlane(), ExternalSystem()

    def fail_over(request: httpx.Request, region: str) -> httpx.Response | None:
        plane.serve(request)
        plane.down, plane.leader = {"us-east"}, "eu-west"
        raise httpx.ReadError("connection reset", request=request)

    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        plane.faults.extend([lambda r, region: None, fail_over])  # the attempt, then the effect
        run = client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
    assert tool.runs == ["call_1"] and run.ran
    effects = [e for e in plane.events["c1"] if e["type"] == "tool.effect"]
    assert len(effects) == 1
    assert [region for region, r in plane.sent if r.method == "POST"][-2:] == ["us-east", "eu-west"]


def test_a_run_that_gave_up_on_a_committed_effect_is_not_run_again() -> None:
    """Every region goes dark right after the effect commits: the first run gives up, with the
    effect recorded. Once the plane is back, a second run finds it and does not run the tool."""
    plane, tool = FakePlane(), ExternalSystem()

    def commit_then_go_dark(request: httpx.Request, region: str) -> httpx.Response | None:
        plane.serve(request)
        plane.down = {"us-east", "eu-west", "ap-south"}
        raise httpx.ReadTimeout("timed out", request=request)

    with plane.client(VirtualClock(), attempts_max=3) as client:
        client.create_conversation("c1")
        plane.faults.extend([lambda r, region: None, commit_then_go_dark])
        with pytest.raises(TransportFailed):
            client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
        plane.down = set()
        again = client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
    assert tool.runs == ["call_1"]
    assert (again.ran, again.state, again.result) == (
        False,
        "committed",
        {"charged": 5, "key": "call_1"},
    )


def test_a_tool_that_raised_leaves_the_attempt_pending_and_runs_again_with_its_key() -> None:
    plane, tool = FakePlane(), ExternalSystem()

    def flaky(key: str) -> dict[str, Any]:
        tool.runs.append(key)
        if len(tool.runs) == 1:
            raise TimeoutError("the payment API did not answer")
        return {"ok": True}

    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        with pytest.raises(TimeoutError):
            client.run_tool_once("c1", "call_1", "charge", {}, flaky)
        assert client.tool_attempt("c1", "call_1").state == "pending"
        run = client.run_tool_once("c1", "call_1", "charge", {}, flaky)
    assert tool.runs == ["call_1", "call_1"] and run.state == "committed"


def test_tool_failed_is_recorded_and_never_run_again() -> None:
    plane, tool = FakePlane(), ExternalSystem()

    def declined(key: str) -> None:
        tool.runs.append(key)
        raise ToolFailed("card declined")

    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        first = client.run_tool_once("c1", "call_1", "charge", {}, declined)
        second = client.run_tool_once("c1", "call_1", "charge", {}, declined)
    assert tool.runs == ["call_1"]
    assert (first.state, first.error, first.ran) == ("failed", "card declined", True)
    assert (second.state, second.error, second.ran) == ("failed", "card declined", False)


def test_a_concurrent_runs_effect_wins_the_conflict() -> None:
    """Another process committed a different effect while this one ran the tool: 409
    effect_conflict, and the recorded effect is the answer."""
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")

        def raced(key: str) -> str:
            client.commit_tool_effect("c1", key, result="theirs")
            return "mine"

        run = client.run_tool_once("c1", "call_1", "lookup", {}, raced)
    assert (run.result, run.ran) == ("theirs", True)


def test_other_arguments_for_a_recorded_attempt_are_a_conflict() -> None:
    plane, tool = FakePlane(), ExternalSystem()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        client.run_tool_once("c1", "call_1", "charge", {"amount": 5}, tool.charge)
        with pytest.raises(Conflict):
            client.run_tool_once("c1", "call_1", "charge", {"amount": 6}, tool.charge)
    assert tool.runs == ["call_1"]


def test_the_blocking_client_refuses_a_coroutine_tool() -> None:
    plane = FakePlane()

    async def tool(key: str) -> None:
        return None

    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        with pytest.raises(TypeError, match="AsyncClient"):
            client.run_tool_once("c1", "call_1", "t", {}, tool)

"""The local supervisor's side of kill drills (services.control.drills.local_kill): kill once while the
drill injects or holds, restart once it restores; a drill that names a node kills and restarts
only that node."""

from __future__ import annotations

import httpx

from services.control.drills.local_kill import KillDrills


class FakePlane:
    def __init__(self) -> None:
        self.actions: list[str] = []

    def kill_region(self, name: str) -> None:
        self.actions.append(f"kill {name}")

    def restart_region(self, name: str) -> None:
        self.actions.append(f"restart {name}")

    def kill_node(self, name: str, index: int) -> None:
        self.actions.append(f"kill {name} node {index}")

    def restart_node(self, name: str, index: int) -> None:
        self.actions.append(f"restart {name} node {index}")


def client_answering(phases: list[str], node: int | None = None) -> httpx.Client:
    """A client whose GET /v1/drills answers one kill drill (of ``node``, as the API lists it),
    in the next phase each call."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer op-key"
        phase = phases.pop(0)
        drills = [
            {"drill_id": "d1", "kind": "kill", "region": "us-east", "node": node, "phase": phase},
            {"drill_id": "d0", "kind": "region-loss", "region": "eu-west", "phase": "holding"},
        ]
        return httpx.Response(200, json={"drills": drills})

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_the_target_is_killed_once_and_restarted_once_when_the_drill_restores() -> None:
    plane = FakePlane()
    supervisor = KillDrills(plane, ["http://node.test"], "op-key")
    phases = ["injecting", "holding", "holding", "restoring", "restoring", "done"]
    with client_answering(phases) as client:
        said = [line for _ in range(6) for line in supervisor.poll(client)]
    assert plane.actions == ["kill us-east", "restart us-east"]
    assert said == ["kill drill d1: killed us-east", "kill drill d1: restarted us-east"]


def test_a_node_kill_kills_and_restarts_only_that_node_once() -> None:
    plane = FakePlane()
    supervisor = KillDrills(plane, ["http://node.test"], "op-key")
    phases = ["injecting", "holding", "holding", "restoring", "restoring", "done"]
    with client_answering(phases, node=1) as client:
        said = [line for _ in range(6) for line in supervisor.poll(client)]
    assert plane.actions == ["kill us-east node 1", "restart us-east node 1"]
    assert said == [
        "kill drill d1: killed us-east node 1",
        "kill drill d1: restarted us-east node 1",
    ]


def test_no_node_answering_changes_nothing() -> None:
    plane = FakePlane()
    supervisor = KillDrills(plane, ["http://node.test"], "op-key")

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(refuse)) as client:
        assert supervisor.poll(client) == []
    assert plane.actions == []

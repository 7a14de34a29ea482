"""Kill drills on a local plane: the ``convplane up`` supervisor carries them out.

A ``kill`` drill is a record in the control shard like any other (``services.control.drills.driver``); only the
process that started the plane can SIGKILL a region's node and database and start them again,
so the supervisor polls the plane's drills (with the operator key ``up`` created) every
``SUPERVISE_POLL_S``: a kill drill injecting or holding gets its target killed once; once the
drill restores (or ends), the target is started again and the drill's driver restores it in the
placement. The driver counts the fault from the drill's first record, so the poll's delay makes
the measured RTO longer, never shorter.

A kill drill that names a ``node`` kills only that node of its region (``kill_node``: its
database and sibling nodes run on, and a sibling takes its slot) and starts only it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from regions.drill_kinds import KINDS_BY_NAME

#: one poll of the plane's drills
POLL_TIMEOUT_S = 1.0
DRILLS_POLLED_MAX = 20
FAULT_PHASES = ("injecting", "holding")


class Killable(Protocol):
    def kill_region(self, name: str) -> None: ...

    def restart_region(self, name: str) -> None: ...

    def kill_node(self, name: str, index: int) -> None: ...

    def restart_node(self, name: str, index: int) -> None: ...


@dataclass(frozen=True)
class Target:
    """What a kill drill kills: a region, or one node of it."""

    region: str
    node: int | None

    def __str__(self) -> str:
        return self.region if self.node is None else f"{self.region} node {self.node}"

    def kill(self, plane: Killable) -> None:
        if self.node is None:
            plane.kill_region(self.region)
        else:
            plane.kill_node(self.region, self.node)

    def restart(self, plane: Killable) -> None:
        if self.node is None:
            plane.restart_region(self.region)
        else:
            plane.restart_node(self.region, self.node)


class KillDrills:
    def __init__(self, plane: Killable, urls: list[str], operator_api_key: str) -> None:
        self._plane = plane
        self._urls = urls
        self._headers = {"Authorization": f"Bearer {operator_api_key}"}
        #: drill id -> what this supervisor killed and has not restarted yet
        self._killed: dict[str, Target] = {}
        self._done: set[str] = set()

    def poll(self, client: httpx.Client) -> list[str]:
        """One look at the plane's drills; returns what it did, for the console."""
        drills = self._drills(client)
        if drills is None:
            return []
        done: list[str] = []
        for d in drills:
            rules = KINDS_BY_NAME.get(str(d.get("kind")))
            if rules is None or rules.fault != "process":
                continue
            drill_id, phase = str(d["drill_id"]), str(d["phase"])
            if (
                phase in FAULT_PHASES
                and drill_id not in self._killed
                and drill_id not in self._done
            ):
                node = d.get("node")  # a node of the plane's own release: int or None
                target = Target(str(d["region"]), node if type(node) is int else None)
                target.kill(self._plane)
                self._killed[drill_id] = target
                done.append(f"kill drill {drill_id}: killed {target}")
            elif phase not in FAULT_PHASES and drill_id in self._killed:
                target = self._killed.pop(drill_id)
                target.restart(self._plane)
                self._done.add(drill_id)
                done.append(f"kill drill {drill_id}: restarted {target}")
        return done

    def _drills(self, client: httpx.Client) -> list[dict[str, Any]] | None:
        for url in self._urls:
            try:
                reply = client.get(
                    url.rstrip("/") + "/v1/drills",
                    params={"limit": DRILLS_POLLED_MAX},
                    headers=self._headers,
                    timeout=POLL_TIMEOUT_S,
                )
            except httpx.HTTPError:
                continue
            if reply.status_code == 200:
                drills: list[dict[str, Any]] = reply.json()["drills"]
                return drills
        return None

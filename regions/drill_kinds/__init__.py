"""Drill kinds, one module each: what a kind takes away from its target, how it is injected and
restored, its own preflight rule and how its report counts recovery. Pure: no I/O, no clock.

Each kind's module declares one ``DrillKindRules`` (``rules``); ``KINDS_BY_NAME`` is the
registry, in ``DrillKind``'s order. The state machine (``regions.drills``), the preflight
(``regions.drill_plan``), the driver and its helpers (``services.control.drills``) and the
plane simulation ask a kind's rules (``rules_of``), never its name.

Where a change goes: a new kind whose fault is one of ``rules.Fault``'s is a module here, its
name in ``DrillKind`` and its line in ``KINDS_BY_NAME`` (this file), plus its tests
(``tests/unit/test_drill_kinds.py`` holds the registry and ``DrillKind`` equal). A new fault
also needs its injection and restore in ``services.control.drills`` (``driver``; ``faults`` when
every node acts on it, ``local_kill`` when ``convplane up``'s supervisor does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from regions.drill_kinds import evacuate, kill, region_loss
from regions.drill_kinds.rules import DrillKindRules, Fault

#: the API's ``kind`` (the REST body and the OpenAPI document take it from here)
DrillKind = Literal["evacuate", "region-loss", "kill"]
#: the registry, in ``DrillKind``'s order (the plane simulation draws kinds from it by index)
KINDS_BY_NAME: Mapping[str, DrillKindRules] = {
    rules.name: rules for rules in (evacuate.KIND, region_loss.KIND, kill.KIND)
}

__all__ = ["KINDS_BY_NAME", "DrillKind", "DrillKindRules", "Fault", "rules_of"]


def rules_of(kind: str) -> DrillKindRules:
    """The rules of a kind a drill record names (``DrillSpec`` refuses any other kind)."""
    return KINDS_BY_NAME[kind]

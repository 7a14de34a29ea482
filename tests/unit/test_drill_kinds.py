"""The drill kinds' registry: every kind the API takes has its rules, in the API's order."""

from __future__ import annotations

from typing import get_args

from regions.drill_kinds import KINDS_BY_NAME, DrillKind, rules_of
from regions.drill_kinds.rules import Fault
from regions.drills import KINDS


def test_the_registry_holds_exactly_the_api_kinds_in_their_order() -> None:
    # the plane simulation draws kinds by index: the order is part of every seed
    assert tuple(KINDS_BY_NAME) == get_args(DrillKind) == KINDS


def test_each_kind_names_itself_and_a_known_fault() -> None:
    for name, rules in KINDS_BY_NAME.items():
        assert rules.name == name
        assert rules.fault in get_args(Fault)
        assert rules_of(name) is rules


def test_only_a_killed_process_needs_the_local_supervisor() -> None:
    needing = {r.name for r in KINDS_BY_NAME.values() if r.needs_supervisor}
    assert needing == {r.name for r in KINDS_BY_NAME.values() if r.fault == "process"}

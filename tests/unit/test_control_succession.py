"""The control shard's succession (regions.control_succession): a node passes over the region it
deferred the control shard to when that region has not led it for ``wait_s``, and gives it its
turn back once it leads, names someone new, or is no longer alive. Pure: times are given."""

from __future__ import annotations

from regions.control_succession import ControlSuccession, HeardOf

ALIVE = ["a", "b", "c"]
WAIT_S = 10.0


def heard(leading: set[str], named: dict[str, str]) -> HeardOf:
    return lambda region: (region in leading, named.get(region))


def test_two_nodes_that_name_each_other_end_the_standoff_within_the_wait() -> None:
    """b defers to a, a (which believes itself excluded) names b: after WAIT_S, b passes a over
    and chooses itself; before that it keeps deferring."""
    b = ControlSuccession("b", WAIT_S)
    nobody_leads = heard(set(), {"a": "b"})
    for now_s in (0.0, 5.0, 9.9):
        b.observe(now_s, ALIVE, frozenset(), nobody_leads)
        assert b.choose(ALIVE, frozenset()) == "a", now_s
    b.observe(10.0, ALIVE, frozenset(), nobody_leads)
    assert b.choose(ALIVE, frozenset()) == "b"


def test_a_region_heard_leading_is_never_passed_over() -> None:
    c = ControlSuccession("c", WAIT_S)
    for now_s in range(0, 100, 5):
        c.observe(float(now_s), ALIVE, frozenset(), heard({"a"}, {"a": "a"}))
    assert c.choose(ALIVE, frozenset()) == "a"


def test_a_passed_over_region_gets_its_turn_back_when_it_leads_or_learns_something() -> None:
    b = ControlSuccession("b", WAIT_S)
    b.observe(0.0, ALIVE, frozenset(), heard(set(), {"a": "b"}))
    b.observe(10.0, ALIVE, frozenset(), heard(set(), {"a": "b"}))
    assert b.passed_over == {"a": "b"}
    b.observe(11.0, ALIVE, frozenset(), heard(set(), {"a": "a"}))  # a names itself now
    assert b.choose(ALIVE, frozenset()) == "a"
    b.observe(21.0, ALIVE, frozenset(), heard(set(), {"a": "a"}))
    b.observe(31.0, ALIVE, frozenset(), heard(set(), {"a": "a"}))  # still does not lead
    assert b.choose(ALIVE, frozenset()) == "b"
    b.observe(32.0, ALIVE, frozenset(), heard({"a"}, {"a": "a"}))  # a leads
    assert b.choose(ALIVE, frozenset()) == "a" and not b.passed_over


def test_the_wait_restarts_for_each_region_deferred_to_and_exclusions_still_hold() -> None:
    """a excludes itself (a drill's target) and defers to b; b is passed over after the wait,
    then c gets a whole wait of its own; an excluded region is never chosen while any other
    is alive."""
    a = ControlSuccession("a", WAIT_S)
    excluded = frozenset({"a"})
    silent = heard(set(), {})
    a.observe(0.0, ALIVE, excluded, silent)
    a.observe(10.0, ALIVE, excluded, silent)
    assert a.choose(ALIVE, excluded) == "c"
    a.observe(11.0, ALIVE, excluded, silent)
    a.observe(20.0, ALIVE, excluded, silent)
    assert a.choose(ALIVE, excluded) == "c"
    a.observe(21.0, ALIVE, excluded, silent)
    assert a.choose(ALIVE, excluded) == "b"  # everyone passed over: the rule alone

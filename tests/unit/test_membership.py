"""Failure detection: suspicion from missing probes, a majority to declare a region down."""

from __future__ import annotations

from regions.membership import Membership, MembershipConfig

REGIONS = ("ap-south", "eu-west", "us-east")


def membership(
    me: str = "eu-west",
    *,
    detection_s: float = 1.0,
    grace_s: float = 5.0,
    regions: tuple[str, ...] = REGIONS,
) -> Membership:
    return Membership(
        self_region=me,
        regions=regions,
        config=MembershipConfig(detection_s, grace_s),
        started_s=0.0,
    )


def all_ok(m: Membership, now_s: float, suspects: dict[str, list[str]] | None = None) -> None:
    for peer in m.regions:
        if peer != m.self_region:
            m.probe_ok(peer, now_s, suspects=(suspects or {}).get(peer, []))


def test_a_peer_is_suspected_after_detection_s_without_a_successful_probe() -> None:
    m = membership()
    all_ok(m, 10.0)
    m.probe_ok("us-east", 10.5, suspects=[])
    assert m.suspects(10.9) == frozenset()
    m.probe_failed("ap-south", 10.9)
    assert m.suspects(11.0) == {"ap-south"}
    assert m.status("ap-south", 11.0) == "suspected"  # one suspicion (mine) is not a majority
    assert m.declared_down(11.0) == frozenset()


def test_suspects_region_agrees_with_suspects() -> None:
    """The per-region check a shard leader asks on every proposal answers as the set does: for
    a peer never seen (within and past its grace), a silent one, a fresh one, and this node."""
    m = membership()
    m.probe_ok("us-east", 10.0, suspects=[])
    for now_s in (0.5, 4.9, 5.0, 10.5, 11.0, 30.0):
        suspected = m.suspects(now_s)
        assert {r for r in REGIONS if m.suspects_region(r, now_s)} == suspected
    assert m.suspects(4.9) == frozenset() and m.suspects(11.0) == {"ap-south", "us-east"}
    assert not m.suspects_region("eu-west", 30.0)  # never itself
    assert not m.suspects_region("mars", 30.0)  # nor a region it does not know


def test_a_majority_of_suspicions_declares_a_region_down() -> None:
    m = membership()
    all_ok(m, 10.0)
    m.probe_ok("us-east", 11.2, suspects=["ap-south"])
    assert m.suspected_by("ap-south", 11.2) == ("eu-west", "us-east")
    assert m.declared_down(11.2) == {"ap-south"}
    assert m.status("ap-south", 11.2) == "down"
    assert m.alive(11.2) == ["eu-west", "us-east"]  # eu-west, first, leads the control shard


def test_a_minoritys_suspicion_is_not_enough() -> None:
    # us-east is cut off: it suspects everyone, nobody agrees with it
    cut_off = membership("us-east")
    all_ok(cut_off, 10.0)
    assert cut_off.suspects(20.0) == {"ap-south", "eu-west"}
    assert cut_off.declared_down(20.0) == frozenset()  # each suspected by only one region
    assert cut_off.alive(20.0)[0] == "ap-south"  # so it never tries to lead control
    # the majority side sees only us-east's old reply; us-east is suspected by both of them
    majority = membership("eu-west")
    all_ok(majority, 10.0)
    majority.probe_ok("ap-south", 20.0, suspects=["us-east"])
    assert majority.declared_down(20.0) == {"us-east"}


def test_one_peer_cannot_get_another_declared_down_alone() -> None:
    m = membership("eu-west", regions=("a", "b", "c", "d", "eu-west"))
    all_ok(m, 10.0, {"a": ["d"], "b": ["d"]})
    assert m.declared_down(10.1) == frozenset()  # a, b: 2 of 5
    m.probe_ok("c", 10.2, suspects=["d"])
    assert m.declared_down(10.2) == {"d"}  # a, b, c: 3 of 5


def test_a_flapping_peer_clears_suspicion_on_each_success() -> None:
    m = membership(detection_s=1.0)
    all_ok(m, 0.0)
    t = 0.0
    for _ in range(20):  # answers every 0.9 s: never missing for a whole detection window
        t += 0.9
        assert "ap-south" not in m.suspects(t)
        m.probe_ok("ap-south", t, suspects=[])
        m.probe_ok("us-east", t, suspects=[])
    t += 1.0
    m.probe_ok("us-east", t, suspects=["ap-south"])
    assert m.declared_down(t) == {"ap-south"}
    m.probe_ok("ap-south", t + 0.1, suspects=[])
    m.probe_ok("us-east", t + 0.1, suspects=[])
    assert m.declared_down(t + 0.1) == frozenset()  # back up as soon as it answers again


def test_a_peer_never_heard_from_is_not_suspected_during_the_start_grace() -> None:
    m = membership(grace_s=5.0)
    assert m.suspects(4.9) == frozenset()
    assert m.suspects(5.0) == {"ap-south", "us-east"}


def test_replies_cannot_make_a_peer_suspect_itself_or_unknown_regions() -> None:
    m = membership()
    m.probe_ok("us-east", 1.0, suspects=["us-east", "nowhere", "ap-south"], led_shards=[3, 4])
    assert m.suspected_by("us-east", 1.0) == ()
    assert m.suspected_by("ap-south", 1.0) == ("us-east",)
    assert m.led_shards_of("us-east") == {3, 4}
    assert m.heard_since("us-east", 1.0) and not m.heard_since("us-east", 1.1)

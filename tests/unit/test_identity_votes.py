"""Which replicas' promises a node counts after its identity sweeps (``eventlog.identity``).

Found by the whole-plane simulation (seed 2214 on PLANE_SIM_VERSION 4): a restarted node's
first sweep reached only region b's store, which had lost its disk. No other registry vouched
for b, so its verdict was "unknown" with no expected identity, and ``vouches_for`` let the
wiped store's empty promise count: a prepare quorum of {a, wiped b} recovered a log that ended
before the commit point, and the shard's committed entries diverged."""

from __future__ import annotations

from eventlog.identity import IdentityGuard, IdentityRecord, Observation, plan_sweep


def test_a_region_no_sweep_could_verify_does_not_vote() -> None:
    guard = IdentityGuard()
    only_b = {
        "a": Observation(None, None),
        "b": Observation("b#2", {}),  # wiped: a new identity, an empty registry
        "c": Observation(None, None),
    }
    guard.apply(plan_sweep(only_b))
    assert guard.verdicts["b"].state == "unknown" and guard.verdicts["b"].expected is None
    assert not guard.vouches_for("b", "b#2")
    assert not guard.vouches_for("a", "a#1")  # never seen at all


def test_an_admitted_region_votes_with_its_known_identity_only() -> None:
    guard = IdentityGuard()
    registry = {r: IdentityRecord(f"{r}#1") for r in "abc"}
    guard.apply(plan_sweep({r: Observation(f"{r}#1", registry) for r in "abc"}))
    assert guard.vouches_for("b", "b#1")
    assert not guard.vouches_for("b", "b#2")


def test_a_node_that_never_swept_counts_every_promise() -> None:
    assert IdentityGuard().vouches_for("b", "anything")


def test_a_region_no_sweep_could_verify_counts_toward_no_ack() -> None:
    """The same store that may not vote may not count toward an ack or a read confirmation
    either (issue 32's rule: a replica whose identity was not read and vouched for must not
    count): an append to it names no identity, so a store wiped since would be counted as if it
    held what it had acknowledged. It counts once a sweep names its identity."""
    guard = IdentityGuard()
    assert guard.counts("b")  # a node that never swept (a unit test's) counts every replica
    guard.apply(plan_sweep({"a": Observation(None, None), "b": Observation("b#2", {}),
                            "c": Observation(None, None)}))  # fmt: skip
    assert not guard.counts("b") and guard.expected_store("b") is None
    assert not guard.counts("a")  # unreachable, never named
    registry = {r: IdentityRecord(f"{r}#1") for r in "ac"} | {"b": IdentityRecord("b#2")}
    guard.apply(plan_sweep({r: Observation(registry[r].store_id, registry) for r in "abc"}))
    assert guard.counts("b") and guard.expected_store("b") == "b#2"
    assert guard.counts("a") and guard.counts("c")

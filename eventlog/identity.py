"""Replica identity: a store that lost what it promised must not vote or count toward an ack.

The protocol's safety rests on every voter still holding what it promised and acknowledged. A
database that was re-provisioned, dropped and recreated, or restored from an older logical
backup comes back with its promises reset and an empty or older log; if it voted, a new leader
could be elected by a quorum that holds none of an acknowledged entry (bug 5: acked by {a, b};
b wiped; a cut off; c takes over through {b, c}; the entry is gone).

So every store has a durable identity, ``store_id``, created with its schema (a new database is a
new identity), and every store keeps a *registry*: for each region, the identity that region's
replica is known by, with a ``generation`` an operator raises when it re-admits a rebuilt
replica. A node sweeps the stores (``LogNode.verify_replicas``): it reads each store's identity
and registry, and for each region ``r`` takes the registry entries that *other* regions' stores
hold for ``r`` (a wiped store has lost its own registry, so it cannot vouch for itself):

* no other reachable store knows ``r`` (a new cluster): trust on first use: ``r``'s current
  identity is recorded in every reachable store;
* the best record (highest generation) names ``r``'s current identity: ``r`` is admitted (and
  the record is copied to stores that lack it);
* it names another identity: ``r`` is **quarantined**: its promises are not counted in a
  prepare, its acks not in a write quorum, it serves no reads, and an operator is told (log,
  ``/healthz``, ``GET /v1/regions``, the ``convplane_replica_quarantined`` metric) until it is
  rebuilt from a quorum and re-admitted (``eventlog.rebuild``, ``convplane replica rebuild``).

A leader also re-reads a voter's identity *after* its promise: ids are random and never reused,
so a store wiped between the sweep and the prepare cannot slip a vote in. And every append names
the identity the sweep vouched for (``expected_store``); the store checks it in the transaction
that writes and otherwise writes nothing (``IdentityMismatch``), which quarantines the replica on
this node at once (``refused``). So a store wiped between two sweeps never adopts a deposed
leader's epoch, is never refilled by it and never counts toward its acks; and a leader counts a
replica's acks only while they were made under the identity vouched for now (``ShardLeader``).

A *physical* restore of the same database files keeps ``store_id`` and brings back an older log
(issue 32, bug 4). What the restored store cannot bring back is what the *other* stores learnt
about it since: every append leaves there the ``HeldPosition`` the leader knows each replica to
hold (``ReplicaStore.positions``). A new leader compares each voter's log with the positions
the other reachable stores keep for it (``eventlog.recovery.rolled_back_voters``); a voter below
its position is **rolled back**: its vote does not count, it is quarantined on this node at once
(``rolled_back``) and in the registry of every other store (a record at a higher generation
naming ``ROLLED_BACK_PREFIX + store_id``, so every node's next sweep quarantines it too) until
it is rebuilt and re-admitted, which writes its own identity at a higher generation still.
See docs/replica-identity.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ReplicaState = Literal["admitted", "quarantined", "unknown"]
#: a registry record naming this (no store's identity starts with it) quarantines the store
#: whose identity follows: it was found rolled back to an older copy of itself
ROLLED_BACK_PREFIX = "rolled-back:"


@dataclass(frozen=True, slots=True)
class IdentityRecord:
    """What the cluster knows a region's replica as."""

    store_id: str
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """One sweep's reading of one store: its identity and registry (None: unreachable)."""

    store_id: str | None
    registry: Mapping[str, IdentityRecord] | None


@dataclass(frozen=True, slots=True)
class Verdict:
    state: ReplicaState
    expected: IdentityRecord | None
    found: str | None


@dataclass
class SweepPlan:
    """What a sweep concluded: per region a verdict, and the records to write where."""

    verdicts: dict[str, Verdict] = field(default_factory=dict)
    #: store region -> records (region -> record) that store should hold
    writes: dict[str, dict[str, IdentityRecord]] = field(default_factory=dict)


def plan_sweep(observations: Mapping[str, Observation]) -> SweepPlan:
    """Decide, from one sweep over every store, which replicas are admitted. Pure."""
    plan = SweepPlan()
    reachable = [r for r, o in observations.items() if o.registry is not None]
    for region, observed in observations.items():
        known = [
            o.registry[region]
            for other, o in observations.items()
            if other != region and o.registry is not None and region in o.registry
        ]
        current = observed.store_id
        if not known:
            if current is None or not any(r != region for r in reachable):
                plan.verdicts[region] = Verdict("unknown", None, current)
                continue
            best = IdentityRecord(current)  # trust on first use: a new cluster
        else:
            top = max(k.generation for k in known)
            ids = {k.store_id for k in known if k.generation == top}
            if len(ids) > 1:  # two re-admissions raced: trust neither until one wins
                plan.verdicts[region] = Verdict("quarantined", None, current)
                continue
            best = IdentityRecord(ids.pop(), top)
        if current is None:
            plan.verdicts[region] = Verdict("unknown", best, None)
        elif current == best.store_id:
            plan.verdicts[region] = Verdict("admitted", best, current)
        else:
            plan.verdicts[region] = Verdict("quarantined", best, current)
            continue  # never spread a record while its region disagrees with it
        for store in reachable:
            held = observations[store].registry
            assert held is not None
            if held.get(region) != best and (
                region not in held or held[region].generation <= best.generation
            ):
                plan.writes.setdefault(store, {})[region] = best
    return plan


class IdentityGuard:
    """A node's current verdicts, consulted by its shard leaders on every vote and ack."""

    def __init__(self) -> None:
        self.verdicts: dict[str, Verdict] = {}
        self.swept = False

    def apply(self, plan: SweepPlan) -> list[str]:
        """Take a sweep's verdicts (an unreachable store keeps its last verdict); returns the
        regions newly quarantined."""
        newly = []
        for region, verdict in plan.verdicts.items():
            previous = self.verdicts.get(region)
            if verdict.state == "unknown" and previous is not None:
                continue
            if verdict.state == "quarantined" and (
                previous is None or previous.state != "quarantined"
            ):
                newly.append(region)
            self.verdicts[region] = verdict
        self.swept = True
        return newly

    def expected_store(self, region: str) -> str | None:
        """The identity ``region``'s replica must have for an append to it to count (None: no
        sweep has named one, e.g. a unit test's node that does not verify)."""
        verdict = self.verdicts.get(region)
        return None if verdict is None or verdict.expected is None else verdict.expected.store_id

    def refused(self, region: str) -> bool:
        """A store refused an append that named ``expected_store(region)``: it is another
        store now (wiped, replaced). Quarantine it until a sweep finds it re-admitted; returns
        whether it was newly quarantined."""
        previous = self.verdicts.get(region)
        if previous is None or previous.state == "quarantined":
            return False
        self.verdicts[region] = Verdict("quarantined", previous.expected, None)
        return True

    def rolled_back(self, region: str) -> IdentityRecord | None:
        """A leader found ``region``'s store below a position it had held (an older physical
        copy, same identity): quarantine it here, and return the record that quarantines it
        in the registries (None: no sweep named its identity, nothing to write)."""
        previous = self.verdicts.get(region)
        expected = None if previous is None else previous.expected
        self.verdicts[region] = Verdict("quarantined", expected, None)
        if expected is None:
            return None
        return IdentityRecord(ROLLED_BACK_PREFIX + expected.store_id, expected.generation + 1)

    def counts(self, region: str) -> bool:
        """Whether ``region``'s replica may vote and count toward acks and read confirmations:
        not while quarantined, and only once a sweep has named the identity it is known by
        (appends to it name that identity, so a store wiped since refuses them). A region no
        sweep could name yet (unreachable, or the only store the sweep reached) does not count:
        an append to it would name no identity. Before the first sweep (a node that does not
        verify, e.g. a unit test's) every replica counts."""
        verdict = self.verdicts.get(region)
        if verdict is not None and verdict.state == "quarantined":
            return False
        if verdict is None or verdict.expected is None:
            return not self.swept
        return True

    def vouches_for(self, region: str, store_id: str) -> bool:
        """Whether a promise from a store that now says it is ``store_id`` may count: only
        once a sweep has named the identity ``region``'s replica is known by, and only from
        that identity. A region no sweep of this node could verify yet (e.g. its first sweep
        after a restart reached only that store) does not vote: it may be a wiped store.
        Before the first sweep (a node that does not verify, e.g. a unit test's) all count."""
        verdict = self.verdicts.get(region)
        if verdict is not None and verdict.state == "quarantined":
            return False
        if verdict is None or verdict.expected is None:
            return not self.swept
        return verdict.state != "quarantined" and verdict.expected.store_id == store_id

    def quarantined(self) -> dict[str, Verdict]:
        return {r: v for r, v in self.verdicts.items() if v.state == "quarantined"}

"""The whole-plane simulation (``services.plane_sim``): real log nodes, controllers and drill
drivers of 3 and 5 regions on virtual time, seeded faults and drills (region-loss, evacuate,
kill; half of them of the control leader's own region), linearizable reads, and liveness checked:
the control shard led after healing, every drill ended, no two nodes deferring the control shard
to each other for long.

CI runs CONVPLANE_PLANE_SEEDS seeds (default 2000: four fifths on 3 regions, one fifth on 5),
spread over the machine's cores. A failing seed becomes a named scenario test (see
tests/sim/test_safety_scenarios.py) or, while it reproduces, a pinned regression seed below.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import pytest

from eventlog.identity import IdentityGuard
from eventlog.leader import ShardLeader
from eventlog.node import LogNode
from services.plane_sim import PLANE_SIM_VERSION, run_plane_seed
from tests.sim.mutations import (
    commits_wake_no_followers,
    control_fold_applies_unpublished,
    control_successors_awaited_forever,
    counted_ack_violations,
    stores_ignore_the_identity_appends_name,
)

SEEDS = int(os.environ.get("CONVPLANE_PLANE_SEEDS", "2000"))
CHUNK = 50
#: (regions, seed) that reproduce bugs on this PLANE_SIM_VERSION with the fix taken out, by bug:
#: (3, 12), (3, 64) (found on version 3, again on 4) — a control leader that was paused while another took over woke up, kept
#: believing it led the control shard (it read its own stale commit point) and blocked every
#: placement change for good (fixed: LogNode.read_committed confirms leadership first).
#: (3, 2488) — an operator's replica rebuild read its source after a newer leader had written
#: there and appended that epoch's entry at its own older epoch: the store refused it as a
#: broken append contract (fixed in eventlog.rebuild); found on version 2 as seed 7729, and on
#: version 3 as seed 2488; from version 4 on it is the named test tests/unit/test_newer_epoch_races.
#: Version 1's seeds 2195, 2548, 3111, ... found a leader reading from its own freshly wiped
#: replica (stale transcripts until the next identity sweep); version 2 changed the schedules,
#: so that bug is the named scenario test_a_replica_wiped_under_a_serving_leader_serves_no_short_read
#: (3, 2214) (version 4) — a restarted node whose first identity sweep reached only a wiped
#: store let that store's empty promise count (its verdict "unknown" vouched): committed entries
#: diverged (fixed: IdentityGuard.vouches_for; tests/unit/test_identity_votes.py).
#: Version 5 (control handoffs publish their commit position; read rounds and the control
#: fold cannot hang): 12 and 64 still fail with their fix taken out; 2214 no longer does, and
#: no seed of 0-1999 or 3700-6999 does (stop 21's search), so that bug is guarded by its unit
#: test, tests/unit/test_identity_votes.py.
#: Version 6 (drills in every seed, the control shard's push linger drawn per seed, blips of the
#: control leader): (3, 40), (3, 58) (also 63 and 80 of 0-99) — issue 32's bug 2: a region-loss
#: drill of the control leader's own region, its fold applying the drill record inside the push
#: linger and its fence resigning: the target named b, b named the target, nobody led the
#: control shard again and the drill never ended (fixed: the control leader applies and hands
#: over only what a write quorum's commit hints hold; regions.control_succession). Named
#: scenarios: tests/sim/test_control_standoffs.py. 12 and 64 (version 5) are not re-checked
#: on version 6. Since the held positions wake the followers at every commit (issue 32 bug 4's
#: fix), 40, 58, 63 and 80 pass with that controller fix taken out too (docs/control-shard.md).
#: (3, 345) (version 6, with issue 32's identity-naming appends) — an evacuate drill of a started
#: while b and c were then evacuated by an operator: evacuating a would leave no region to lead,
#: the driver retried the injection forever and the drill never ended (fixed: a drill whose
#: evacuation can never be made is aborted, services.control.drills.driver.DrillDriver._drive).
#: (3, 1002205) (version 6; the fix changed no replay of 33 other seeds compared) — b led three
#: shards with c unverified, they went idle, then b's sweep vouched for c and for b's rebuilt
#: store under a new identity: neither idle follower counted or sent again, every write was
#: refused ("1 replicas reachable, 2 needed") for good (fixed: ShardLeader.identities_vouched;
#: named scenario tests/sim/test_identity_liveness.py).
#: Version 7 (the control leader's blip at the commit of a region-loss drill's start or end,
#: from an rng of its own): version 6's seeds are pinned again; in none of them does that blip
#: fire, so each replays as on version 6.
VERSION_6_SEEDS = [(3, 40), (3, 58), (3, 345), (3, 1002205)]
REGRESSION_SEEDS = {5: [(3, 12), (3, 64)], 6: VERSION_6_SEEDS, 7: VERSION_6_SEEDS}.get(
    PLANE_SIM_VERSION, []
)


def _chunk(regions: int, first: int, last: int) -> dict[int, list[str]]:
    logging.disable(logging.CRITICAL)
    failures = {}
    for seed in range(first, last):
        result = run_plane_seed(seed, regions=regions)
        if not result.ok:
            failures[seed] = result.violations[:5]
    return failures


def _plan() -> list[tuple[int, int, int]]:
    five = SEEDS // 5
    chunks = [(3, s, min(s + CHUNK, SEEDS - five)) for s in range(0, SEEDS - five, CHUNK)]
    chunks += [(5, s, min(s + CHUNK, five)) for s in range(0, five, CHUNK)]
    return chunks


def test_every_seed_keeps_every_invariant() -> None:
    workers = max(1, min(os.cpu_count() or 1, 4))
    failures: dict[str, list[str]] = {}
    with ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(_chunk, *c): c for c in _plan()}
        for future, (regions, _first, _last) in futures.items():
            for seed, violations in future.result().items():
                failures[f"--regions {regions} --start {seed}"] = violations
    assert not failures, f"failing seeds (rerun with convplane sim ... --seeds 1): {failures}"


@pytest.mark.parametrize(("regions", "seed"), REGRESSION_SEEDS)
def test_regression_seed(regions: int, seed: int) -> None:
    assert run_plane_seed(seed, regions=regions).ok


def test_same_seed_replays_exactly() -> None:
    first, second = run_plane_seed(5, regions=3), run_plane_seed(5, regions=3)
    assert first == second


def test_the_simulation_exercises_every_fault_and_path() -> None:
    faults: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for seed in range(30):
        result = run_plane_seed(seed, regions=3 if seed % 3 else 5)
        faults.update(result.faults)
        counts.update(result.counts)
    expected_faults = {
        "partition",
        "one_way_loss",
        "heal_network",
        "database_crash",
        "database_recover",
        "database_stall",
        "node_crash",
        "node_restart",
        "node_pause",
        "node_resume",
        "replica_disk_loss",
        "loss_delay_duplication",
        "evacuate",
        "restore",
        "drill_region-loss",
        "drill_evacuate",
        "drill_kill",
        "control_leader_blip",
        "control_commit_blip",
    }
    assert expected_faults <= set(faults), expected_faults - set(faults)
    for what in ("leader_changes", "placement_changes", "reads_checked", "poison_inputs"):
        assert counts[what] > 30, (what, counts)
    assert counts["drills_ended"] > 5, counts


def test_the_checker_catches_reads_that_skip_the_leadership_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: leaders answer reads without confirming they still lead (bug 3)."""

    async def trusting(self: object) -> None:
        return None

    monkeypatch.setattr(ShardLeader, "confirm_leadership", trusting)
    caught = [s for s in range(40) if not run_plane_seed(s, regions=3).ok]
    assert caught


def test_the_checker_catches_a_plane_that_trusts_wiped_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: every defence against a wiped replica is off (bug 5's identity checks, the
    identity every append names (issue 32), and the leader noticing that a replica holds less
    than it had accepted): some seed loses an ack or serves a read that misses one (seed 170 is
    the first on PLANE_SIM_VERSION 6, with and without the identity-naming appends, and on 5
    with them; 26 on 5 and 4 before them, 70 on 3; the range starts near it, as each seed
    costs about a second)."""
    monkeypatch.setattr(IdentityGuard, "counts", lambda self, region: True)
    monkeypatch.setattr(IdentityGuard, "expected_store", lambda self, region: None)
    monkeypatch.setattr(IdentityGuard, "vouches_for", lambda self, region, store_id: True)
    monkeypatch.setattr(
        ShardLeader, "note_replica_status", lambda self, region, status, asked_at: None
    )
    monkeypatch.setattr(LogNode, "_source_lost_data", staticmethod(lambda *a: False))
    assert any(not run_plane_seed(s, regions=3).ok for s in range(150, 400))


def test_the_checker_catches_a_store_that_accepts_appends_named_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: issue 32's bug 1 alone (the store no longer refuses an append that names
    another identity; the sweep, the prepare's vouching and the leader's lost-entry checks
    stay). A store wiped under a leader is refilled under its old name and counted toward
    commits; the checker's counted-ack invariant (``History.on_commit``) sees it at the first
    such commit, before any later fault makes a lost ack of it (seed 2 is the first on
    PLANE_SIM_VERSION 6; without that invariant none of seeds 0-29 failed)."""
    stores_ignore_the_identity_appends_name(monkeypatch)
    caught = (run_plane_seed(s, regions=3).violations for s in range(10))
    assert any(counted_ack_violations(violations) for violations in caught)


def test_the_checker_catches_a_control_leader_acting_on_unpublished_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: rule 1 of docs/control-shard.md out (the control leader's fold applies what it
    committed before any replica's hint holds it: issue 32's bug 2), with the succession
    backstop out too, since it ends every standoff within ``control_handoff_wait_s``, under the
    checker's bounds, by design, and the commit wake, which publishes a control record before
    its leader can act on it (since stop 49, when nodes learn from their own region's replica,
    it masks rule 1's absence in every seed of 0-699). Seed 107 (3 regions, PLANE_SIM_VERSION
    7, found in seeds 0-149 with rules 1 and 2 out; the commit blip does not fire in it, so it
    runs as on version 6; with the wake out, 58, 80, 88, 163, 165 and 264 of 0-299 too): a
    region-loss drill of the control leader ``a``, whose fold applies it unpublished and whose
    fence then resigns; nobody leads the control shard again and the drill never ends. With
    only the backstop and the wake out it passes: rule 1 alone holds it."""
    control_successors_awaited_forever(monkeypatch)
    commits_wake_no_followers(monkeypatch)
    assert run_plane_seed(107, regions=3).ok
    control_fold_applies_unpublished(monkeypatch)
    violations = run_plane_seed(107, regions=3).violations
    assert any(v.startswith("control shard not led") for v in violations), violations

"""Deterministic simulation of a multi-region log on virtual time (FoundationDB / VOPR style).

``run_seed(seed)`` runs the real core (``LogNode``, ``ShardLeader``) against in-memory replicas on a
simulated network driven by ``random.Random(seed)``, injects faults, then checks the log's
invariants. The same seed always replays the same run.
"""

from eventlog.sim.runner import SIM_VERSION, SeedResult, run_seed

__all__ = ["SIM_VERSION", "SeedResult", "run_seed"]

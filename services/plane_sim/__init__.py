"""Deterministic simulation of the whole plane: the real log nodes *and* the real controllers
(failure detection, the control shard, placement, reconcile, failback, evacuate/restore,
replica identity checks) of 3 or 5 regions on virtual time, with seeded faults, clients whose
every read is checked for linearizability, and liveness checked after healing.

``run_plane_seed(seed, regions=3)`` runs one seed; the same seed replays exactly (on the same
``PLANE_SIM_VERSION``). ``convplane sim --plane`` runs ranges of seeds.
"""

from services.plane_sim.run import PLANE_SIM_VERSION, PlaneResult, run_plane_seed

__all__ = ["PLANE_SIM_VERSION", "PlaneResult", "run_plane_seed"]

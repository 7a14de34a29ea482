"""Failover drills, run from the control shard.

* ``driver``: the ``DrillDriver`` every node runs; the node that leads the control shard drives
  each drill through the pure core ``regions.drills`` (plan, step, report);
* ``canary``: a drill's canary writes, one conversation per shard;
* ``load``: what a drill's preflight and dry run measure (append rate, moved conversations);
* ``faults``: the software black-hole of a ``region-loss`` drill, at every node;
* ``local_kill``: ``kill`` drills carried out by ``convplane up``'s supervisor.

Imports ``services.control.controller`` and the cores; nothing from the HTTP edge (``services.api``).
"""

"""Failover drills, run from the control shard.

* ``driver``: the ``DrillDriver`` every node runs; the node that leads the control shard drives
  each drill through the pure core ``regions.drills`` (plan, step, report);
* ``canary``: a drill's canary writes, one conversation per shard;
* ``load``: what a drill's preflight and dry run measure (append rate, moved conversations);
* ``faults``: the software black-hole of a ``region-loss`` drill, at every node;
* ``local_kill``: ``kill`` drills carried out by ``convplane up``'s supervisor.

Imports ``services.control.controller`` and the cores; nothing from the HTTP edge
(``services.api``). Where a change goes: a new drill kind is named in ``regions.drills.DrillKind``
(the REST body and the OpenAPI document take it from there) with its preflight rule in
``regions.drill_plan``; how its fault is injected and restored goes in ``driver`` (and in
``faults`` when every node must act on it, in ``local_kill`` when ``convplane up``'s supervisor
carries it out); its tests in ``tests/unit/test_drill_*.py`` and the plane simulation
(``services.plane_sim``).
"""

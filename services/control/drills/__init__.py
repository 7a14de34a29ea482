"""Failover drills, run from the control shard.

* ``driver``: the ``DrillDriver`` every node runs; the node that leads the control shard drives
  each drill through the pure core ``regions.drills`` (plan, step, report);
* ``canary``: a drill's canary writes, one conversation per shard;
* ``load``: what a drill's preflight and dry run measure (append rate, moved conversations);
* ``faults``: the software black-hole of a ``region-loss`` drill, at every node;
* ``local_kill``: ``kill`` drills carried out by ``convplane up``'s supervisor.

Imports ``services.control.controller`` and the cores; nothing from the HTTP edge
(``services.api``). Where a change goes: a new drill kind is one module in
``regions.drill_kinds`` and its line in that registry (the REST body, the OpenAPI document and
everything here ask a kind's rules, never its name). Only a new kind of fault (``Fault``: how
the target is taken away and given back) adds code here: its injection and restore in
``driver``, and in ``faults`` when every node must act on it or in ``local_kill`` when
``convplane up``'s supervisor carries it out.
"""

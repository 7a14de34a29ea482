"""Control of the plane at each node: the controller and what it reads and keeps.

* ``controller``: failure detection, control-shard leadership, placement and reconciliation,
  four supervised loops around the pure cores in ``regions``;
* ``peer_probe``: how a node asks a peer for its health (a one-method port and its HTTP adapter);
* ``node_metrics``: the controller's state as Prometheus series;
* ``audit_log``: the audit log's rate limit and complete pages;
* ``key_admin``: API keys created, rotated and revoked through the control shard;
* ``readiness``: the readiness of each region's loss (``regions.readiness``), re-evaluated by
  the control leader in a supervised loop, and its gauges;
* ``drills``: failover drills, driven from the control shard (see its docstring);
* ``practice``: practice runs, the drills a schedule starts behind blocking conditions and
  approvals (a loop on the controller's supervisor).

Imports the node-wide basics (``services.config``, ``services.supervisor``) and the cores;
nothing from the HTTP edge (``services.api``). Where a change goes: a new control decision
in ``regions`` (pure), carried out by a loop of ``controller``; a new record of the control
shard in ``regions.ops_state``, applied here.
"""

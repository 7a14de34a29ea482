"""The processes: a region node, the ``convplane`` CLI, the local plane and the simulator.

Packages by capability, each depending only on those below it (``lint-imports`` checks it):

* ``cli``: the ``convplane`` command;
* ``local``: a whole plane on one machine (``convplane up``'s supervisor, its databases,
  broker, simulated engines, the fault proxy); ``plane_sim``: the whole plane simulated
  deterministically (``convplane sim``);
* ``bootstrap``: a node's runtime: the wiring, the app and the process serving it;
* ``console``: the operators' console (page and read endpoint), on the edge;
* ``api``: the HTTP edge (routes, schemas, admission, auth, forwarding, OpenAPI);
* ``control``: the controller, what the control shard keeps (keys, audit) and the failover
  drills it drives (``control.drills``); ``replay``: the replay service;
* ``deploy``: the compose stack's secrets and databases, database roles, the installation check,
  the configuration reference;
* the node-wide basics at this root: ``config``, ``logs``, ``tracing``, ``cluster_tls``,
  ``supervisor`` (and ``listeners``, served by ``bootstrap.serve``).

Nothing imports ``services``. Where a change goes: a new endpoint in ``api`` (see its
docstring); a new node setting in ``config.NodeSettings`` (``CONVPLANE_*`` environment
variables); what the console shows in ``console/static/`` (plain files, no build step;
``tests/e2e/test_console.py`` drives them in Chromium); a new background loop runs under
``supervisor`` so a crash shows; a new drill kind in ``control.drills`` (see its docstring).
"""

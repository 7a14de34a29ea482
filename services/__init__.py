"""The processes: a region node (``node``, wired in ``bootstrap``: log node, controller, replay
service, drill driver, FastAPI app in ``api``), the controller that carries out placement
(``controller``), the drill driver (``drills`` and its ``drill_*`` helpers), the replay service
(``replay``), the operators' console (``console``: its page, static files and read endpoint),
the ``convplane`` CLI (``cli``), and the whole-plane simulation (``plane_sim``).
``local`` is the local plane (harnesses for PostgreSQL, Kafka, engines, the up supervisor, the
fault proxy, chaos): not the service. Nothing imports ``services``.

Where a change goes: a new endpoint in ``api`` (its schema in ``api.schemas``, its errors in
the OpenAPI document: ``tests/e2e/test_openapi_contract.py`` checks both); a new node setting
in ``config.NodeSettings`` (``CONVPLANE_*`` environment variables); what the console shows in
``console/static/`` (plain files, no build step; ``tests/e2e/test_console.py`` drives them in
Chromium); a new background loop runs
under ``supervisor`` so a crash shows.
"""

"""The local plane: what runs a whole multi-region plane on one machine for a newcomer, the tests
and the benchmarks. Not the service: nothing in production imports it except ``convplane up``
and ``convplane worker --sim``-style local commands.

* ``postgres``: one PostgreSQL instance per region from Debian's server binaries (or yours, or
  testcontainers where Docker runs), SCRAM and TLS set up;
* ``kafka``: a KRaft broker from Maven-fetched jars on loopback (or yours, or testcontainers);
* ``plane``: ``convplane up``'s supervisor of node processes (and databases) per region;
  ``plane_state`` what makes it the same plane after a stop, ``plane_processes`` its processes
  by pid (``convplane down``), ``region_restart`` ``convplane restart-region``;
* ``engines``: simulated inference engines (``replay.engines.sim_server``) as processes;
* ``host``: free ports and the ``convplane`` command a child runs.

The chaos harness that puts fault proxies between a plane's regions is a test's, not the
product's: ``tests/harness``.
"""

"""A region node's runtime: the one place the object graph is wired (cosmicpython's
``bootstrap``), the app assembled on it, and the process that serves it.

* ``node``: one region node's runtime (``open_runtime``, over ``NodeAdapters``): replica stores,
  the log node, the pooled peer client, the controller, the drill driver and (through
  ``replay``) the replay service, closed in reverse order; ``replica_timing`` wraps the replica
  stores for metrics and traces;
* ``replay``: the replay service over its engines, bus and in-process workers, and its routes'
  state and metrics on the app;
* ``api``: the REST app's state on top of a runtime (forwarder, tenants, metrics, admission,
  console), opened by the app's lifespan;
* ``app``: ``create_app(settings)``, the FastAPI app: the edge's routers, middleware and
  lifespan;
* ``serve``: the app under uvicorn on the node's two listeners (``listener_gates``: what each
  lets through);
* ``worker``: a replay worker process (``convplane worker``): engine, spare gate, Kafka bus,
  transcripts over the region's REST API;
* ``operator``: an operator's tools (``convplane replica ...``).

The CLI and the tests build nothing themselves: they call these. Where a change goes: a new
adapter or service of a node is opened and closed in ``node`` (``NodeAdapters`` when the
simulator must swap it); a new router is included in ``app``.
"""

from services.bootstrap.node import (
    NodeAdapters,
    NodeRuntime,
    RuntimeFactory,
    open_replica_stores,
    open_runtime,
)

__all__ = ["NodeAdapters", "NodeRuntime", "RuntimeFactory", "open_replica_stores", "open_runtime"]

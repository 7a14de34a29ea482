"""The one place the object graph is wired (cosmicpython's ``bootstrap``): adapters meet the
core here and nowhere else.

* ``node``: one region node's runtime (``open_runtime``, over ``NodeAdapters``): replica stores, the log node, the
  pooled peer client, the controller, the drill driver and (through ``replay``) the replay
  service, closed in reverse order;
* ``replay``: the replay service over its engines, bus and in-process workers, and its routes'
  state and metrics on the app;
* ``api``: the REST app's state on top of a runtime (forwarder, tenants, metrics, admission,
  console), opened by the app's lifespan (``services.api.app``);
* ``worker``: a replay worker process (``convplane worker``): engine, spare gate, Kafka bus,
  transcripts over the region's REST API.

The app, the CLI and the tests build nothing themselves: they call these.
"""

from services.bootstrap.node import (
    NodeAdapters,
    NodeRuntime,
    RuntimeFactory,
    open_replica_stores,
    open_runtime,
)

__all__ = ["NodeAdapters", "NodeRuntime", "RuntimeFactory", "open_replica_stores", "open_runtime"]

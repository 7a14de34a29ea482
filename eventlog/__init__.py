"""convplane's replicated, quorum-acknowledged, fenced conversation event log: the core the
rest of the plane rests on. It imports nothing from ``regions``, ``replay`` or ``services``.

Public API (import from the modules): ``node.LogNode`` (a region's view of the log:
``create_conversation``, ``append_event``, ``list_events``, ``lead_shard``; the
``conversations.ConversationLog`` port the API uses; ``committed_view``, a shard's committed
reads for replay's planner), ``replica.ReplicaStore`` (the storage
port), ``stores.open_replica_store`` (PostgreSQL / SQLite), ``memory_replica.MemoryReplica``
(the reference store), ``config.LogConfig`` (every limit, named), ``errors`` (the one error
tree), ``rebuild.rebuild_replica``, ``identity`` (replica identity and quarantine) and
``identity_sweep`` (a node's sweep of the stores' identities),
``backoff``, ``aio`` and ``clock`` (the waits and time everything else uses), ``sim.run_seed``.
The protocol is told in ``leader``'s docstring.

Where a change goes:

* a new event type: ``model`` (its name), ``conversation_state`` (the rules it must obey),
  then ``services.api.event_bodies`` (its body on the wire) and ``replay.chat`` (how a
  prompt renders it);
* a new replica store: implement ``replica.ReplicaStore``; a subclass of
  ``tests/replica_conformance.ReplicaConformance`` runs the contract against it, and the
  simulator (``sim``) can run it;
* a new limit: ``config.LogConfig``, with its unit in the name.
"""

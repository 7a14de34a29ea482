"""Which nodes each replica schema serves: the migrations' compatibility window.

Every node migrates every region's database to the newest schema it knows when it opens it
(``open_replica_store``), so while a plane is upgraded region by region, nodes of the previous
version write to and read from databases already at the new schema. Hence the rules for a
migration (docs/upgrade-backup-restore.md):

* **Forward only.** The chain of revisions only grows: a released migration is never edited,
  reordered or removed, and nothing downgrades a plane's databases (``migrate`` only
  upgrades). A node older than its databases' schema stops at start with Alembic's
  "Can't locate revision" error, so rolling a region back below the schema is refused.
* **Additive inside the window.** A migration may add tables, columns with defaults, indexes and
  functions that older nodes never call; it may not change what an older node inside the window
  reads or writes. Each revision states, in ``OLDEST_PEER_PROTOCOL_SERVED``, the oldest peer
  protocol (``services.peer_protocol``) whose nodes still work on a database at that revision;
  it is never above the oldest protocol the same version's nodes serve, so every node that may
  still be in the plane during an upgrade runs on the schema its upgraded peers leave.
"""

from __future__ import annotations

#: revision -> the oldest peer protocol whose nodes work on a database at that revision
OLDEST_PEER_PROTOCOL_SERVED: dict[str, int] = {
    "0001": 1,
    "0002": 1,
    "0003": 1,
    "0004": 1,
    "0005": 1,
    "0006": 1,
    "0007": 1,
}

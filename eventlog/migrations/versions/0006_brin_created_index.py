"""PostgreSQL finds "conversations active since T" from the recent part of a shard, not all of it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

``list_conversations`` (the replay scheduler's "conversations active within the replay window")
used to aggregate every entry of the shard and keep the conversations whose latest activity was
at least T: a scan of the whole shard, growing with the log's age, run for every shard a
failover moves, on the survivors, when their capacity is scarcest. It now asks first which
conversations have *any* entry at or after T (the same set: a conversation's latest activity is
at least T exactly when one of its entries is) and then sums only those conversations' entries
through ``ix_entries_conversation``.

The first step reads entries by ``created_at_ms``. Entries arrive in time order, so their pages
are too, and a BRIN index (block range: the smallest and largest ``created_at_ms`` per 128 heap
pages; about 32 kB for a 411 MB table) narrows it to the pages written since T. A BRIN insert
costs nearly nothing: a new entry lands in the newest, still unsummarised range and the index is
not touched; ``autosummarize`` has autovacuum summarise a range once the table has moved past it.
(0005 dropped a B-tree on ``(shard, created_at_ms)`` that cost every replica an index insert per
entry and that the old query could not use.)

Measured (``EXPLAIN ANALYZE``, 1,000,000 entries in 64 shards, 15,625 in the shard, the last
20,000 entries inside the window): 74 ms and 15,625 heap pages read before, 4.7 ms and 349 after.

SQLite (the embedded demo) has no BRIN; its query is the same, and scans the shard.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEX = "ix_entries_created_brin"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE INDEX {INDEX} ON entries USING brin (created_at_ms) WITH (autosummarize = on)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP INDEX {INDEX}")

"""Conversations are keyed by (tenant_id, conversation_id): the index that finds a
conversation's entries leads with the tenant.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

No row changes: every entry has always carried its tenant, and the log only ever let the tenant
that created a conversation append to it, so each existing conversation keeps its entries under
its one (tenant, id) key. Only the index changes: with ``(shard, conversation_id, seq)`` a read of
one tenant's conversation would walk, and filter out, every entry another tenant wrote under the
same id (a tenant could slow another's reads by filling "their" id).
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_entries_conversation", table_name="entries")
    op.create_index(
        "ix_entries_conversation", "entries", ["shard", "tenant_id", "conversation_id", "seq"]
    )


def downgrade() -> None:
    op.drop_index("ix_entries_conversation", table_name="entries")
    op.create_index("ix_entries_conversation", "entries", ["shard", "conversation_id", "seq"])

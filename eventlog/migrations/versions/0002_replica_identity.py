"""Replica identity: the store's own ``store_id`` and its registry of every region's replica.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

The ``store_id`` is made here, once per database: a database that is dropped and recreated, or
re-provisioned empty, runs this migration again and gets a new one. See ``eventlog.identity``.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    identity = op.create_table(
        "replica_identity",
        sa.Column("singleton", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("store_id", sa.Text, nullable=False),
    )
    op.create_table(
        "replica_registry",
        sa.Column("region", sa.Text, primary_key=True),
        sa.Column("store_id", sa.Text, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(identity, [{"singleton": 1, "store_id": uuid.uuid4().hex}])


def downgrade() -> None:
    op.drop_table("replica_registry")
    op.drop_table("replica_identity")

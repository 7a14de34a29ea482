"""An append names the store it is meant for; a store that is another one writes nothing.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

A wiped (re-provisioned) database has no promise: a deposed leader's append re-promised its old
epoch there, refilled it and counted it toward its acks before the next identity sweep could
quarantine it (issue 32, bug 1). Now a leader sends the identity its node's sweep vouched for
with every append (``ReplicaStore.append``'s ``expected_store_id``), and the store compares it
with its own in the statement that writes, so nothing can swap the store between the check and
the write.

``convplane_append_as(p_store_id, ...)`` takes ``convplane_append``'s 17 arrays after the
expected identity (as ``SqlReplicaStore.identity`` spells it: the migration's store id, ``/db``,
the database's oid). On a mismatch it answers every request of the group with kind 4 (the
identity mismatch) and calls nothing; else it returns ``convplane_append``'s rows. It is a
plain (``SECURITY INVOKER``) function: it reads only ``replica_identity`` and ``pg_database``,
which every node's role may read, and writes only through ``convplane_append``, with that
function's own rights, so ``services.db_roles`` needs no new grant. ``convplane_append`` itself
is unchanged (its signature, body and the roles' grants on it).
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

APPEND_AS_FUNCTION = r"""
CREATE OR REPLACE FUNCTION convplane_append_as(
    p_store_id text,
    b_shard integer[], b_epoch bigint[], b_prev_lsn bigint[], b_prev_epoch bigint[],
    b_leader_commit bigint[], b_count integer[],
    e_lsn bigint[], e_epoch bigint[], e_tenant text[], e_conversation text[], e_seq bigint[], e_type text[],
    e_idempotency text[], e_attempt text[], e_tokens bigint[], e_created bigint[], e_body text[]
) RETURNS TABLE(o_index integer, o_kind smallint, o_value bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    found_id text;
BEGIN
    -- the identity as SqlReplicaStore.identity reads it; a store without exactly one identity
    -- row has none (never equal)
    SELECT CASE WHEN count(*) = 1 THEN min(i.store_id) END
           || '/db' || (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())::text
    INTO found_id FROM replica_identity i;
    IF found_id IS DISTINCT FROM p_store_id THEN
        RETURN QUERY SELECT (k - 1)::integer, 4::smallint, 0::bigint
                     FROM generate_subscripts(b_shard, 1) AS k;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM convplane_append(
        b_shard, b_epoch, b_prev_lsn, b_prev_epoch, b_leader_commit, b_count, e_lsn, e_epoch,
        e_tenant, e_conversation, e_seq, e_type, e_idempotency, e_attempt, e_tokens, e_created,
        e_body);
END
$fn$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_AS_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "DROP FUNCTION convplane_append_as(text, integer[], bigint[], bigint[], bigint[], "
            "bigint[], integer[], bigint[], bigint[], text[], text[], bigint[], text[], text[], "
            "text[], bigint[], bigint[], text[])"
        )

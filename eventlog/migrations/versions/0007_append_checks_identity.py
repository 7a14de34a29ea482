"""An append names the store it is meant for, and leaves the positions its leader knows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

A wiped (re-provisioned) database has no promise: a deposed leader's append re-promised its old
epoch there, refilled it and counted it toward its acks before the next identity sweep could
quarantine it (issue 32, bug 1). Now a leader sends the identity its node's sweep vouched for
with every append (``ReplicaStore.append``'s ``expected_store_id``), and the store compares it
with its own in the statement that writes, so nothing can swap the store between the check and
the write.

A store restored from an older physical copy of itself keeps its identity and loses what it
acknowledged (bug 4). ``replica_positions`` keeps, per shard and region, the highest
``HeldPosition`` (epoch, lsn) an append left here: the committed prefix the leader knew that
region's replica to hold. A new leader compares each voter's log with what the *other* stores
keep for it (``eventlog.recovery.rolled_back_voters``).

``convplane_append_as(p_store_id, <convplane_append's 17 arrays>, p_pos_shard, p_pos_region,
p_pos_epoch, p_pos_lsn)``: ``p_store_id`` (NULL: not checked) is the identity the caller
expects, as ``SqlReplicaStore.identity`` spells it (the migration's store id, ``/db``, the
database's oid); on a mismatch every request of the group gets kind 4 (the identity mismatch)
and nothing is written. Else it runs ``convplane_append`` and, in the same statement, raises
the positions of every shard whose request was accepted (kind 0). No extra round trip: the
positions ride the append.

``convplane_append`` is unchanged. Where ``services.db_roles`` made it ``SECURITY DEFINER``
(node roles may not write tables directly), the new function gets the same settings and the
same grantees (it writes ``replica_positions``); ``db_roles`` lists it for new databases.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

APPEND_AS_SIGNATURE = (
    "convplane_append_as(text, integer[], bigint[], bigint[], bigint[], bigint[], integer[], "
    "bigint[], bigint[], text[], text[], bigint[], text[], text[], text[], bigint[], bigint[], "
    "text[], integer[], text[], bigint[], bigint[])"
)

POSITIONS_TABLE = """
CREATE TABLE replica_positions (
    shard integer NOT NULL,
    region text NOT NULL,
    epoch bigint NOT NULL,
    lsn bigint NOT NULL,
    PRIMARY KEY (shard, region)
)
"""

APPEND_AS_FUNCTION = r"""
CREATE OR REPLACE FUNCTION convplane_append_as(
    p_store_id text,
    b_shard integer[], b_epoch bigint[], b_prev_lsn bigint[], b_prev_epoch bigint[],
    b_leader_commit bigint[], b_count integer[],
    e_lsn bigint[], e_epoch bigint[], e_tenant text[], e_conversation text[], e_seq bigint[], e_type text[],
    e_idempotency text[], e_attempt text[], e_tokens bigint[], e_created bigint[], e_body text[],
    p_pos_shard integer[], p_pos_region text[], p_pos_epoch bigint[], p_pos_lsn bigint[]
) RETURNS TABLE(o_index integer, o_kind smallint, o_value bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    found_id text;
    r_index integer[];
    r_kind smallint[];
    r_value bigint[];
BEGIN
    -- the identity as SqlReplicaStore.identity reads it; a store without exactly one identity
    -- row has none (never equal)
    SELECT CASE WHEN count(*) = 1 THEN min(i.store_id) END
           || '/db' || (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())::text
    INTO found_id FROM replica_identity i;
    IF p_store_id IS NOT NULL AND found_id IS DISTINCT FROM p_store_id THEN
        RETURN QUERY SELECT (k - 1)::integer, 4::smallint, 0::bigint
                     FROM generate_subscripts(b_shard, 1) AS k;
        RETURN;
    END IF;
    SELECT array_agg(a.o_index ORDER BY a.o_index), array_agg(a.o_kind ORDER BY a.o_index),
           array_agg(a.o_value ORDER BY a.o_index)
    INTO r_index, r_kind, r_value
    FROM convplane_append(
        b_shard, b_epoch, b_prev_lsn, b_prev_epoch, b_leader_commit, b_count, e_lsn, e_epoch,
        e_tenant, e_conversation, e_seq, e_type, e_idempotency, e_attempt, e_tokens, e_created,
        e_body) AS a;
    IF coalesce(array_length(p_pos_shard, 1), 0) > 0 THEN
        -- for the shards with an accepted request (kind 0), the highest position per region
        -- (a group may hold several requests of one shard)
        INSERT INTO replica_positions AS held (shard, region, epoch, lsn)
        SELECT DISTINCT ON (p.shard, p.region) p.shard, p.region, p.epoch, p.lsn
        FROM unnest(p_pos_shard, p_pos_region, p_pos_epoch, p_pos_lsn)
             AS p(shard, region, epoch, lsn)
        WHERE p.shard IN (SELECT b_shard[r.i + 1] FROM unnest(r_index, r_kind) AS r(i, kind)
                          WHERE r.kind = 0)
        ORDER BY p.shard, p.region, p.epoch DESC, p.lsn DESC
        ON CONFLICT (shard, region) DO UPDATE
        SET epoch = excluded.epoch, lsn = excluded.lsn
        WHERE (excluded.epoch, excluded.lsn) > (held.epoch, held.lsn);
    END IF;
    RETURN QUERY SELECT * FROM unnest(r_index, r_kind, r_value);
END
$fn$;
"""


def upgrade() -> None:
    op.execute(POSITIONS_TABLE)
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(APPEND_AS_FUNCTION)
    bind = op.get_bind()
    definer = bind.exec_driver_sql(
        "SELECT prosecdef FROM pg_proc WHERE oid = 'convplane_append'::regproc"
    ).scalar()
    if not definer:
        return
    # the node roles' rights, as services.db_roles grants them for convplane_append
    op.execute(
        f"ALTER FUNCTION {APPEND_AS_SIGNATURE} SECURITY DEFINER SET search_path = public, pg_temp"
    )
    op.execute(f"REVOKE ALL ON FUNCTION {APPEND_AS_SIGNATURE} FROM PUBLIC")
    grantees = bind.exec_driver_sql(
        "SELECT DISTINCT a.grantee::regrole::text FROM pg_proc p, aclexplode(p.proacl) a "
        "WHERE p.oid = 'convplane_append'::regproc AND a.privilege_type = 'EXECUTE' "
        "AND a.grantee <> p.proowner AND a.grantee <> 0"
    ).scalars()
    for role in grantees:
        op.execute(f"GRANT EXECUTE ON FUNCTION {APPEND_AS_SIGNATURE} TO {role}")
        op.execute(f"GRANT SELECT ON replica_positions TO {role}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {APPEND_AS_SIGNATURE}")
    op.execute("DROP TABLE replica_positions")

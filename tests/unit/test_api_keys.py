"""API keys (security issue 39 finding 8): names follow a pattern and reserved ones are refused;
keys created, rotated and revoked in the control shard (``regions.keys``) take effect in every
node's authentication (``services.api.auth.Tenants``) as soon as the record is folded, and a
revoked or expired key is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from eventlog.errors import InvalidRequest, Unauthorized
from regions.drills import DRILL_TENANT
from regions.keys import KEY_RECORD, KeyTable, check_name
from regions.ops_state import OpsState
from services.api.auth import Tenants
from services.config import ClusterConfig, RegionConfig, TenantConfig, api_key_sha256
from tests.unit.clocks import ManualClock

NOW_MS = 1_000_000


class WallClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.now_ms = NOW_MS

    def wall_ms(self) -> int:
        return self.now_ms


def _create(name: str, key: str, *, tenant: str = "acme", role: str = "tenant",
            expires_at_ms: int | None = None, by: str | None = None) -> dict[str, Any]:  # fmt: skip
    body = {"op": "create", "name": name, "tenant_id": tenant, "role": role,
            "api_key_sha256": api_key_sha256(key), "expires_at_ms": expires_at_ms}  # fmt: skip
    return body if by is None else {**body, "created_by": by}


def _bearer(key: str) -> str:
    return f"Bearer {key}"


@pytest.mark.parametrize("name", [DRILL_TENANT, "_anything"])
def test_reserved_names_are_refused_with_their_own_message(name: str) -> None:
    with pytest.raises(InvalidRequest, match="reserved"):
        check_name("tenant_id", name)


@pytest.mark.parametrize("name", ["a/b", "", "-x", "a b", "x" * 129, "é"])
def test_names_outside_the_pattern_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequest, match="letters, digits"):
        check_name("tenant_id", name)


@pytest.mark.parametrize(
    "tenants",
    [
        [{"tenant_id": DRILL_TENANT}],
        [{"tenant_id": "a/b"}],
        [{"tenant_id": "acme"}, {"tenant_id": "acme"}],  # two keys of one name
        [{"tenant_id": "acme", "key_name": "k"}, {"tenant_id": "other", "key_name": "k"}],
    ],
)
def test_the_cluster_file_refuses_bad_reserved_and_duplicate_key_names(
    tenants: list[dict[str, str]],
) -> None:
    keys = [{**t, "api_key_sha256": api_key_sha256(f"key-{i}")} for i, t in enumerate(tenants)]
    with pytest.raises(ValidationError):
        ClusterConfig(
            regions=[RegionConfig(name="a", url="http://a", dsn="memory")],
            tenants=[TenantConfig.model_validate(k) for k in keys],
        )


def _tenants(table: KeyTable, clock: WallClock) -> Tenants:
    file_key = TenantConfig(tenant_id="demo", api_key_sha256=api_key_sha256("file-key"),
                            requests_per_s=7.0)  # fmt: skip
    return Tenants([file_key], clock, keys=table)


def test_a_created_key_authenticates_with_its_tenants_quota_until_revoked() -> None:
    table, clock = KeyTable(), WallClock()
    tenants = _tenants(table, clock)
    with pytest.raises(Unauthorized):
        tenants.authenticate(_bearer("new-key"))
    assert table.apply(_create("demo-2", "new-key", tenant="demo"))
    tenant = tenants.authenticate(_bearer("new-key"))
    assert (tenant.tenant_id, tenant.name, tenant.requests_per_s) == ("demo", "demo-2", 7.0)
    assert table.apply({"op": "revoke", "name": "demo-2"})
    with pytest.raises(Unauthorized, match="revoked"):
        tenants.authenticate(_bearer("new-key"))


def test_an_expired_key_is_refused() -> None:
    table, clock = KeyTable(), WallClock()
    tenants = _tenants(table, clock)
    table.apply(_create("short", "short-key", expires_at_ms=NOW_MS + 10))
    assert tenants.authenticate(_bearer("short-key")).tenant_id == "acme"
    clock.now_ms = NOW_MS + 10
    with pytest.raises(Unauthorized, match="expired"):
        tenants.authenticate(_bearer("short-key"))


def test_a_cluster_file_key_can_be_revoked_and_rotated_without_a_restart() -> None:
    table, clock = KeyTable(), WallClock()
    tenants = _tenants(table, clock)
    rotate = {"op": "rotate", "name": "demo", "old_expires_at_ms": NOW_MS + 5,
              "new": _create("demo-r1", "rotated-key", tenant="demo")}  # fmt: skip
    assert table.apply(rotate)
    assert tenants.authenticate(_bearer("file-key")).tenant_id == "demo"  # within the grace
    assert tenants.authenticate(_bearer("rotated-key")).name == "demo-r1"
    clock.now_ms = NOW_MS + 5
    with pytest.raises(Unauthorized):
        tenants.authenticate(_bearer("file-key"))
    assert table.apply({"op": "revoke", "name": "demo-r1"})
    with pytest.raises(Unauthorized):
        tenants.authenticate(_bearer("rotated-key"))


def test_a_taken_name_or_key_and_a_revoked_rotation_are_recorded_no_ops() -> None:
    table = KeyTable()
    assert table.apply(_create("k", "key-1"))
    assert not table.apply(_create("k", "key-2"))  # the first committed wins
    assert not table.apply(_create("k2", "key-1"))
    assert table.apply({"op": "revoke", "name": "k"})
    assert not table.apply({"op": "revoke", "name": "k"})
    rotate = {"op": "rotate", "name": "k", "old_expires_at_ms": 0, "new": _create("k3", "key-3")}
    assert not table.apply(rotate)
    assert table.stale_records == 4 and "k3" not in table.by_name


def test_keys_in_one_line_of_descent_may_share_a_holder_and_siblings_do_not() -> None:
    """The two-person rule's question: ``admin`` (a cluster-file key) created ``a`` and ``b``;
    ``a`` minted ``a2``, ``a2`` minted ``a3``; ``b`` was rotated into ``b2`` by ``c``; ``old``
    was created before creators were recorded."""
    table = KeyTable()
    for body in (
        _create("a", "ka", by="admin"),
        _create("b", "kb", by="admin"),
        _create("c", "kc", by="admin"),
        _create("a2", "ka2", by="a"),
        _create("a3", "ka3", by="a2"),
        _create("old", "kold"),
        {"op": "rotate", "name": "b", "old_expires_at_ms": 5, "new": _create("b2", "kb2", by="c")},
    ):
        assert table.apply(body), body
    assert table.apply({"op": "revoke", "name": "a2"})  # a revoked link still links
    assert table.ancestors("a3") == {"a2", "a", "admin"}
    assert table.ancestors("b2") == {"b", "c", "admin"}
    assert table.ancestors("old") == set()
    same = [("a", "a"), ("a", "a2"), ("a3", "a"), ("admin", "a3"), ("b", "b2"), ("c", "b2")]
    for x, y in same:
        assert table.may_share_a_holder(x, y) and table.may_share_a_holder(y, x), (x, y)
    for x, y in [("a", "b"), ("a3", "b2"), ("a2", "c"), ("old", "a"), ("old", "admin")]:
        assert not table.may_share_a_holder(x, y) and not table.may_share_a_holder(y, x), (x, y)


def test_a_creator_loop_in_the_records_ends_the_walk() -> None:
    table = KeyTable()
    assert table.apply(_create("x", "kx", by="y")) and table.apply(_create("y", "ky", by="x"))
    assert table.ancestors("x") == {"y"} and table.may_share_a_holder("x", "y")


@pytest.mark.parametrize(
    "body",
    [
        {"op": "create"},
        {**_create("k", "key"), "created_by": 7},
        {**_create("k", "key"), "role": "root"},
        {**_create("k", "key"), "api_key_sha256": "not-hex"},
        {**_create("k", "key"), "tenant_id": "a/b"},
        {**_create("k", "key"), "expires_at_ms": "soon"},
        {"op": "rotate", "name": "k", "old_expires_at_ms": 1.5, "new": _create("n", "key")},
        {"op": "grant-everything"},
        [],
    ],
)
def test_a_malformed_key_record_is_skipped_and_counted(body: Any) -> None:
    ops = OpsState()
    assert not ops.apply(1, KEY_RECORD, json.dumps(body))
    assert ops.malformed_records == 1 and not ops.keys.by_name


def test_a_key_record_carries_its_audit_entry() -> None:
    ops = OpsState()
    audit = {"at_ms": 1, "by": "sre", "role": "operator", "action": "key.create",
             "target": "k (acme, tenant)", "reason": "new app"}  # fmt: skip
    assert ops.apply(7, KEY_RECORD, json.dumps({**_create("k", "key"), "audit": audit}))
    assert [(e.lsn, e.action) for e in ops.audit] == [(7, "key.create")]
    assert "k" in ops.keys.by_name

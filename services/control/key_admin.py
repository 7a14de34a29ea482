"""Creating, rotating and revoking API keys on a running plane (``/v1/admin/keys``).

Each change is one ``control.key`` record (``regions.keys``) committed to the control shard by
its leader (other nodes forward there, as for drills), with the operator's audit entry inside
it: the change and its audit entry commit together. Every node applies the record when it
learns it (``services.api.auth.KEY_APPLIED_WITHIN_S``). A key exists in clear only in the
answer to the create or rotate that made it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventlog.clock import Clock
from eventlog.errors import Conflict, InvalidRequest, NotFound, Unavailable
from regions.keys import KEY_RECORD, KeyRecord, KeyTable, Role, check_name
from regions.ops_state import AUDIT_KEY
from services.config import TenantConfig, api_key_sha256
from services.control.drills.driver import APPLY_WAIT_S, DrillDriver

#: the longest a key may live (an expiry further out is refused)
KEY_LIFETIME_MAX_S = 400 * 86_400.0
#: the longest an old key keeps working after a rotation
ROTATION_GRACE_MAX_S = 7 * 86_400.0
#: how often a writer looks whether its record has been applied here
APPLY_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Operator:
    """Who asks: for the audit entry, and the key that asks (a key it creates or rotates in
    descends from it: ``regions.keys.KeyTable.may_share_a_holder``)."""

    by: str
    role: str
    reason: str
    key_name: str


class KeyAdmin:
    def __init__(
        self, driver: DrillDriver, file_keys: Sequence[TenantConfig], clock: Clock
    ) -> None:
        self._driver = driver
        self._file_keys = {t.name: t for t in file_keys}
        self._clock = clock
        self._lock = asyncio.Lock()

    @property
    def keys(self) -> KeyTable:
        return self._driver.ops.keys

    async def create(
        self, tenant_id: str, name: str, role: Role, expires_in_s: float | None, who: Operator
    ) -> tuple[str, KeyRecord]:
        check_name("tenant_id", tenant_id)
        check_name("name", name)
        async with self._lock:
            await self._driver.read_barrier()
            self._check_free(name)
            key, record = self._new_key(name, tenant_id, role, expires_in_s, who.key_name)
            body = {"op": "create", **record.to_body()}
            await self._commit(body, who, "key.create", f"{name} ({tenant_id}, {role})")
            self._check_took_effect(record)
        return key, record

    async def rotate(
        self,
        name: str,
        new_name: str,
        grace_s: float,
        who: Operator,
        expires_in_s: float | None = None,
    ) -> tuple[str, KeyRecord]:
        check_name("name", new_name)
        if not 0 <= grace_s <= ROTATION_GRACE_MAX_S:
            raise InvalidRequest(f"grace_s must be within [0, {ROTATION_GRACE_MAX_S:.0f}]")
        async with self._lock:
            await self._driver.read_barrier()
            tenant_id, role = self._live(name)
            self._check_free(new_name)
            key, record = self._new_key(new_name, tenant_id, role, expires_in_s, who.key_name)
            old_expires_at_ms = self._now_ms() + int(grace_s * 1000)
            body = {
                "op": "rotate",
                "name": name,
                "old_expires_at_ms": old_expires_at_ms,
                "new": record.to_body(),
            }
            await self._commit(body, who, "key.rotate", f"{name} -> {new_name}")
            self._check_took_effect(record)
        return key, record

    async def revoke(self, name: str, who: Operator) -> None:
        async with self._lock:
            await self._driver.read_barrier()
            self._live(name)
            await self._commit({"op": "revoke", "name": name}, who, "key.revoke", name)

    async def read_barrier(self) -> None:
        """Before a read: everything committed before it began is applied here."""
        await self._driver.read_barrier()

    def listing(self) -> list[dict[str, Any]]:
        now_ms = self._now_ms()
        listed = [
            {
                "name": r.name,
                "tenant_id": r.tenant_id,
                "role": r.role,
                "source": "control",
                "expires_at_ms": r.expires_at_ms,
                "revoked": r.revoked,
                "live": r.live_at(now_ms),
                "created_by": r.created_by or None,
            }
            for r in self.keys.by_name.values()
        ]
        for name in sorted(self._file_keys):
            ends_ms = self.keys.file_key_ends_ms.get(name)
            listed.append(
                {
                    "name": name,
                    "source": "cluster-file",
                    "revoked": ends_ms == 0,
                    "expires_at_ms": ends_ms or None,
                    "live": self.keys.file_key_live(name, now_ms),
                }
            )
        return listed

    # --- internals ------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return self._clock.wall_ms()

    def _new_key(
        self, name: str, tenant_id: str, role: Role, expires_in_s: float | None, created_by: str
    ) -> tuple[str, KeyRecord]:
        if expires_in_s is not None and not 0 < expires_in_s <= KEY_LIFETIME_MAX_S:
            raise InvalidRequest(f"expires_in_s must be within (0, {KEY_LIFETIME_MAX_S:.0f}]")
        if self.keys.full:
            raise Unavailable("the control shard holds as many keys as a node keeps")
        key = "cp_" + secrets.token_urlsafe(24)
        expires_at_ms = None if expires_in_s is None else self._now_ms() + int(expires_in_s * 1000)
        sha = api_key_sha256(key)
        return key, KeyRecord(name, tenant_id, role, sha, expires_at_ms, created_by=created_by)

    def _check_free(self, name: str) -> None:
        if name in self.keys.by_name or name in self._file_keys:
            raise Conflict(f"a key named {name!r} exists already (names are never reused)")

    def _live(self, name: str) -> tuple[str, Role]:
        """The tenant and role of the key ``name``, which must still be usable."""
        record = self.keys.by_name.get(name)
        if record is not None and not record.revoked:
            return record.tenant_id, record.role
        file_key = self._file_keys.get(name)
        if file_key is not None and self.keys.file_key_ends_ms.get(name) != 0:
            return file_key.tenant_id, file_key.role
        raise NotFound(f"no key named {name!r} that is not revoked")

    def _check_took_effect(self, record: KeyRecord) -> None:
        if self.keys.by_name.get(record.name) != record:
            raise Conflict(f"another change to key {record.name!r} committed first")

    async def _commit(self, body: dict[str, Any], who: Operator, action: str, target: str) -> None:
        driver = self._driver
        body[AUDIT_KEY] = driver.audit_entry(who.by, who.role, action, target, who.reason)
        lsn = await driver.node.append_record(driver.controller.control_shard, KEY_RECORD, body)
        deadline_s = self._clock.monotonic() + APPLY_WAIT_S
        while driver.ops.applied_lsn < lsn:  # then the change shows in this node's own answer
            if self._clock.monotonic() > deadline_s:
                raise TimeoutError(f"key record {lsn} not applied within {APPLY_WAIT_S}s")
            await self._clock.sleep(APPLY_POLL_S)

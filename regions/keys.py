"""API keys as control state: the records an operator's create, rotate and revoke commit to the
control shard, and the table every node folds from them. Pure.

A ``control.key`` record carries only a key's SHA-256, never the key:

* ``{"op": "create", "name", "tenant_id", "role", "api_key_sha256", "expires_at_ms",
  "created_by"}``: a new key (``expires_at_ms`` null: no expiry; ``created_by``, the name of the
  key that asked for it, absent in records written before it was kept). A name that exists
  already makes it a recorded no-op (two operators racing for one name: the first committed
  wins).
* ``{"op": "revoke", "name"}``: the key is refused from then on. The name may also be a key of
  the cluster file, which is named by its ``key_name`` (default: its tenant id).
* ``{"op": "rotate", "name", "old_expires_at_ms", "new": {create fields}}``: a new key for the
  same tenant and role, and the old one (created or cluster-file) expires at
  ``old_expires_at_ms`` (a grace period in which clients move to the new key), in one record.

Lineage: whoever creates or rotates a key receives it in clear, so a key may be held by the
holder of the key that created it and, after a rotation, by the old key's holder too.
``KeyTable.may_share_a_holder`` says when two keys are in one line of descent (one created or
rotated from the other, directly or through keys in between): the two-person rule
(``services.control.practice``) refuses such a pair, so that an operator cannot approve their
own request with a key they minted themselves.

Each record may carry its audit entry under ``"audit"`` (``regions.ops_state``). Every node's
key table is the cluster file's keys plus the created keys, less the revoked and expired ones
(``services.api.auth.Tenants``). Records come from the log: a malformed one is skipped.

Names: tenant ids and key names are ``NAME_PATTERN`` (the API's ids, starting with a letter or
digit); names starting with ``_`` are the plane's own (``_drill``, the drill canary's tenant)
and are refused with a message of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from eventlog.errors import InvalidRequest

KEY_RECORD = "control.key"
#: what a key may do: ``tenant`` (chat applications), ``operator`` (drills, evacuate/restore,
#: halt, keys), ``viewer`` (read-only: regions, placement, drills, reports, audit)
Role = Literal["tenant", "operator", "viewer"]
#: tenant ids and key names: the API's ids (``services.api.schemas.ID_PATTERN``) starting with a
#: letter or digit; ``_`` starts the plane's own names
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
NAME_CHARS_MAX = 128
ROLES: tuple[Role, ...] = get_args(Role)
#: keys a node keeps from the control shard (created, revoked ones included); past it a create
#: is refused (``KeyTable.full``) rather than growing every node's memory
KEYS_KEPT_MAX = 10_000
_NAME = re.compile(NAME_PATTERN)


def check_name(kind: str, name: str) -> str:
    """``name`` if it may name a tenant or a key; InvalidRequest (400) saying why otherwise."""
    if name.startswith("_"):
        raise InvalidRequest(
            f"{kind} {name!r} is reserved: names starting with '_' are the plane's"
        )
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"{kind} {name!r} must be 1 to {NAME_CHARS_MAX} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class KeyRecord:
    name: str
    tenant_id: str
    role: Role
    api_key_sha256: str
    expires_at_ms: int | None
    revoked: bool = False
    #: the key that created it or rotated it in ("": a cluster-file key's, or not recorded)
    created_by: str = ""

    def live_at(self, now_ms: int) -> bool:
        return not self.revoked and (self.expires_at_ms is None or now_ms < self.expires_at_ms)

    def to_body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tenant_id": self.tenant_id,
            "role": self.role,
            "api_key_sha256": self.api_key_sha256,
            "expires_at_ms": self.expires_at_ms,
            "created_by": self.created_by,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> KeyRecord:
        """Parse the create fields; ValueError (or KeyError/TypeError) when they are not."""
        sha = str(body["api_key_sha256"])
        expires = body.get("expires_at_ms")
        role = next((r for r in ROLES if r == body["role"]), None)
        if not re.fullmatch(r"[0-9a-f]{64}", sha) or role is None:
            raise ValueError("bad api_key_sha256 or role")
        if expires is not None and type(expires) is not int:
            raise ValueError("expires_at_ms must be an integer or null")
        for name in (body["name"], body["tenant_id"]):
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"bad name {name!r}")
        created_by = body.get("created_by") or ""
        if not isinstance(created_by, str) or len(created_by) > NAME_CHARS_MAX:
            raise ValueError(f"bad created_by {created_by!r}")
        return cls(body["name"], body["tenant_id"], role, sha, expires, created_by=created_by)


class KeyTable:
    """The keys committed to the control shard, by name and by SHA-256."""

    def __init__(self) -> None:
        self.by_name: dict[str, KeyRecord] = {}
        self.by_sha256: dict[str, KeyRecord] = {}
        #: cluster-file key name -> wall ms from which it is refused (0: revoked)
        self.file_key_ends_ms: dict[str, int] = {}
        #: records applied as no-ops (a name taken, an unknown key revoked)
        self.stale_records = 0
        #: a key rotated in -> the key it replaced (created or cluster-file)
        self.rotated_from: dict[str, str] = {}

    @property
    def full(self) -> bool:
        return len(self.by_name) >= KEYS_KEPT_MAX

    def apply(self, body: Mapping[str, Any]) -> bool:
        """Fold one ``control.key`` record; ValueError/KeyError/TypeError when malformed."""
        op = body["op"]
        if op == "create":
            return self._create(KeyRecord.from_body(body))
        if op == "revoke":
            return self._revoke(str(body["name"]))
        if op == "rotate":
            name, new, expires = (
                str(body["name"]),
                KeyRecord.from_body(body["new"]),
                body["old_expires_at_ms"],
            )
            if type(expires) is not int:
                raise ValueError("old_expires_at_ms must be an integer")
            old = self.by_name.get(name)
            if old is not None and old.revoked:
                self.stale_records += 1
                return False
            if not self._create(new):
                return False
            self.rotated_from[new.name] = name
            if old is None:
                self._end_file_key(name, expires)
            elif old.expires_at_ms is None or expires < old.expires_at_ms:
                self._put(replace(old, expires_at_ms=expires))
            return True
        raise ValueError(f"unknown key op {op!r}")

    def _create(self, record: KeyRecord) -> bool:
        taken = record.name in self.by_name or record.api_key_sha256 in self.by_sha256
        if taken or self.full:
            self.stale_records += 1
            return False
        self._put(record)
        return True

    def _revoke(self, name: str) -> bool:
        record = self.by_name.get(name)
        if record is None:
            return self._end_file_key(name, 0)
        if record.revoked:
            self.stale_records += 1
            return False
        self._put(replace(record, revoked=True))
        return True

    def _end_file_key(self, name: str, at_ms: int) -> bool:
        if name not in self.file_key_ends_ms and len(self.file_key_ends_ms) >= KEYS_KEPT_MAX:
            self.stale_records += 1
            return False
        self.file_key_ends_ms[name] = min(at_ms, self.file_key_ends_ms.get(name, at_ms))
        return True

    def ancestors(self, name: str) -> set[str]:
        """The keys whose holders may hold ``name`` too: the key that created it, the one it
        was rotated from, theirs, and so on (revoked and expired ones included)."""
        found: set[str] = set()
        todo = [name]
        while todo:
            key = todo.pop()
            record = self.by_name.get(key)
            parents = (record.created_by if record else "", self.rotated_from.get(key, ""))
            for parent in parents:
                if parent and parent not in found and parent != name:
                    found.add(parent)
                    todo.append(parent)
        return found

    def may_share_a_holder(self, a: str, b: str) -> bool:
        """Whether one holder may have both keys: they are one key, or one descends from the
        other. Two keys that a third created are not: that third holder is trusted to have
        handed them to two people (the cluster file's keys are the roots of trust)."""
        return a == b or a in self.ancestors(b) or b in self.ancestors(a)

    def file_key_live(self, name: str, now_ms: int) -> bool:
        return now_ms < self.file_key_ends_ms.get(name, now_ms + 1)

    def _put(self, record: KeyRecord) -> None:
        self.by_name[record.name] = record
        self.by_sha256[record.api_key_sha256] = record

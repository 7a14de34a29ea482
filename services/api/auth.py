"""API keys.

Keys are compared as sha256 hex (the cluster file never holds a key in clear). A node's keys are
the cluster file's plus those created in the control shard (``regions.keys.KeyTable``, folded
by the controller as it learns control records), less the revoked and expired ones: a key
created or revoked through ``/v1/admin/keys`` takes effect at every node once it has learned the
record (``KEY_APPLIED_WITHIN_S``), with no restart. Per-tenant quotas
(``requests_per_s``, ``burst``) are enforced by admission (``services.api.admission``), before a
request does any work, and only at the node where it entered (a forward with a valid peer secret
is not charged again).
"""

from __future__ import annotations

from collections.abc import Mapping

from eventlog.clock import Clock
from eventlog.errors import Unauthorized
from regions.keys import KeyRecord, KeyTable
from services.config import TenantConfig, api_key_sha256

API_KEY_LENGTH_MAX = 512
#: a committed key record is applied at every node that reaches a quorum of replicas within
#: this long: one learn round is ``placement_poll_s`` + ``control_read_timeout_s`` (1.1 s by
#: default); the rest is margin for a loaded host
KEY_APPLIED_WITHIN_S = 5.0
#: TenantConfigs built for control-shard keys, remembered (past it the memo starts afresh)
CONTROL_KEY_CONFIGS_MAX = 4096
#: API keys whose digest is remembered (a request authenticates two or three times on its way:
#: admission, the service-key check, the route); past it the memo starts afresh
KEY_DIGESTS_MAX = 4096


class Tenants:
    def __init__(
        self,
        tenants: list[TenantConfig],
        clock: Clock,
        worker_key_regions: Mapping[str, str] | None = None,
        keys: KeyTable | None = None,
    ) -> None:
        self._by_key_sha256 = {t.api_key_sha256: t for t in tenants}
        self._by_id = {t.tenant_id: t for t in tenants}
        self.file_key_names = frozenset(t.name for t in tenants)
        #: the control shard's keys (None: a node without a controller has only the file's)
        self.keys = keys
        self._configs: dict[KeyRecord, TenantConfig] = {}
        self._clock = clock
        #: replay worker key sha256 -> its region (``ReplayConfig.worker_key_regions``)
        self._worker_key_regions = dict(worker_key_regions or {})
        #: key -> its SHA-256 (a pure function of the key, so it never goes stale)
        self._digests: dict[str, str] = {}

    def is_service_key(self, authorization: str | None) -> bool:
        """Whether this is a replay worker key (of any region)."""
        return self.worker_key_region(authorization) is not None

    def worker_key_region(self, authorization: str | None) -> str | None:
        """The region whose replay jobs this worker key reads for; None: not a worker key."""
        scheme, _, key = (authorization or "").partition(" ")
        if (
            not self._worker_key_regions
            or scheme.lower() != "bearer"
            or not 0 < len(authorization or "") <= API_KEY_LENGTH_MAX
        ):
            return None
        return self._worker_key_regions.get(self._digest(key.strip()))

    def authenticate_read(
        self, authorization: str | None, on_behalf_of: str | None
    ) -> TenantConfig:
        """``authenticate``, or the service key reading for the tenant ``on_behalf_of`` names
        (``X-Convplane-Tenant``; replay workers read transcripts this way)."""
        if not self.is_service_key(authorization):
            return self.authenticate(authorization)
        tenant = self._by_id.get(on_behalf_of or "")
        if tenant is None and self.keys is not None:
            tenant = next(
                (
                    self._config_of(r)
                    for r in self.keys.by_name.values()
                    if r.tenant_id == on_behalf_of and r.role == "tenant"
                ),
                None,
            )
        if tenant is None:
            raise Unauthorized("the service key reads on behalf of a known X-Convplane-Tenant")
        return tenant

    def authenticate(self, authorization: str | None) -> TenantConfig:
        if not authorization or len(authorization) > API_KEY_LENGTH_MAX:
            raise Unauthorized("missing or malformed Authorization header (Bearer <api key>)")
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("Authorization must be 'Bearer <api key>'")
        digest = self._digest(key)
        now_ms = self._clock.wall_ms()
        record = None if self.keys is None else self.keys.by_sha256.get(digest)
        if record is not None:
            if record.revoked:
                raise Unauthorized("this API key was revoked")
            if not record.live_at(now_ms):
                raise Unauthorized("this API key has expired")
            return self._config_of(record)
        tenant = self._by_key_sha256.get(digest)
        if tenant is None:
            raise Unauthorized("unknown API key")
        if self.keys is not None and not self.keys.file_key_live(tenant.name, now_ms):
            raise Unauthorized("this API key was revoked or has expired")
        return tenant

    def _config_of(self, record: KeyRecord) -> TenantConfig:
        """A control-shard key as the TenantConfig the API works with: the quota is that of
        the tenant's cluster-file key, or the default."""
        config = self._configs.get(record)
        if config is None:
            if len(self._configs) >= CONTROL_KEY_CONFIGS_MAX:
                self._configs.clear()
            config = TenantConfig(
                tenant_id=record.tenant_id,
                api_key_sha256=record.api_key_sha256,
                role=record.role,
                key_name=record.name,
            )
            quota = self._by_id.get(record.tenant_id)
            if quota is not None:
                update = {"requests_per_s": quota.requests_per_s, "burst": quota.burst}
                config = config.model_copy(update=update)
            self._configs[record] = config
        return config

    def _digest(self, key: str) -> str:
        digest = self._digests.get(key)
        if digest is None:
            if len(self._digests) >= KEY_DIGESTS_MAX:
                self._digests.clear()
            digest = self._digests[key] = api_key_sha256(key)
        return digest

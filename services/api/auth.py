"""API keys.

Keys are compared as sha256 hex (the cluster file never holds a key in clear). Per-tenant quotas
(``requests_per_s``, ``burst``) are enforced by admission (``services.api.admission``), before a
request does any work, and only at the node where it entered (a forward with a valid peer secret
is not charged again).
"""

from __future__ import annotations

from collections.abc import Mapping

from eventlog.clock import Clock
from eventlog.errors import Unauthorized
from services.config import TenantConfig, api_key_sha256

API_KEY_LENGTH_MAX = 512
#: API keys whose digest is remembered (a request authenticates two or three times on its way:
#: admission, the service-key check, the route); past it the memo starts afresh
KEY_DIGESTS_MAX = 4096


class Tenants:
    def __init__(
        self,
        tenants: list[TenantConfig],
        clock: Clock,
        worker_key_regions: Mapping[str, str] | None = None,
    ) -> None:
        self._by_key_sha256 = {t.api_key_sha256: t for t in tenants}
        self._by_id = {t.tenant_id: t for t in tenants}
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
        tenant = self._by_key_sha256.get(self._digest(key))
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    def _digest(self, key: str) -> str:
        digest = self._digests.get(key)
        if digest is None:
            if len(self._digests) >= KEY_DIGESTS_MAX:
                self._digests.clear()
            digest = self._digests[key] = api_key_sha256(key)
        return digest

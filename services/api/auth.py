"""API keys.

Keys are compared as sha256 hex (the cluster file never holds a key in clear). Per-tenant quotas
(``requests_per_s``, ``burst``) are enforced by admission (``services.api.admission``), before a
request does any work, and only at the node where it entered (a forward with a valid peer secret
is not charged again).
"""

from __future__ import annotations

from eventlog.clock import Clock
from eventlog.errors import Unauthorized
from services.config import TenantConfig, api_key_sha256

API_KEY_LENGTH_MAX = 512
#: API keys whose digest is remembered (a request authenticates two or three times on its way:
#: admission, the service-key check, the route); past it the memo starts afresh
KEY_DIGESTS_MAX = 4096


class Tenants:
    def __init__(
        self, tenants: list[TenantConfig], clock: Clock, service_key_sha256: str | None = None
    ) -> None:
        self._by_key_sha256 = {t.api_key_sha256: t for t in tenants}
        self._by_id = {t.tenant_id: t for t in tenants}
        self._clock = clock
        #: the replay service key (cluster file ``replay.service_api_key_sha256``)
        self._service_key_sha256 = service_key_sha256
        #: key -> its SHA-256 (a pure function of the key, so it never goes stale)
        self._digests: dict[str, str] = {}

    def is_service_key(self, authorization: str | None) -> bool:
        scheme, _, key = (authorization or "").partition(" ")
        return (
            self._service_key_sha256 is not None
            and scheme.lower() == "bearer"
            and 0 < len(authorization or "") <= API_KEY_LENGTH_MAX
            and self._digest(key.strip()) == self._service_key_sha256
        )

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

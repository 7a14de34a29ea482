"""API keys and per-tenant quotas.

Keys are compared as sha256 hex (the cluster file never holds a key in clear). Quotas are token
buckets (rate ``requests_per_s``, capacity ``burst``) on the injected clock; a request over quota
gets 429 with the seconds until a token is back. Requests forwarded by a peer were charged where
they entered, so they are not charged again.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventlog.clock import Clock
from eventlog.errors import QuotaExceeded, Unauthorized
from services.config import TenantConfig, api_key_sha256

API_KEY_LENGTH_MAX = 512


@dataclass
class TokenBucket:
    rate_per_s: float
    capacity: float
    tokens: float
    updated_s: float

    def take(self, now_s: float) -> float:
        """Take one token; returns 0.0 when taken, else the seconds until one is available."""
        elapsed_s = max(0.0, now_s - self.updated_s)
        self.tokens = min(self.capacity, self.tokens + elapsed_s * self.rate_per_s)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class Tenants:
    def __init__(
        self, tenants: list[TenantConfig], clock: Clock, service_key_sha256: str | None = None
    ) -> None:
        self._by_key_sha256 = {t.api_key_sha256: t for t in tenants}
        self._by_id = {t.tenant_id: t for t in tenants}
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        #: the replay service key (cluster file ``replay.service_api_key_sha256``)
        self._service_key_sha256 = service_key_sha256

    def is_service_key(self, authorization: str | None) -> bool:
        scheme, _, key = (authorization or "").partition(" ")
        return (
            self._service_key_sha256 is not None
            and scheme.lower() == "bearer"
            and 0 < len(authorization or "") <= API_KEY_LENGTH_MAX
            and api_key_sha256(key.strip()) == self._service_key_sha256
        )

    def authenticate_read(self, authorization: str | None, on_behalf_of: str | None) -> TenantConfig:
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
        tenant = self._by_key_sha256.get(api_key_sha256(key))
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    def charge(self, tenant: TenantConfig) -> None:
        now_s = self._clock.monotonic()
        bucket = self._buckets.get(tenant.tenant_id)
        if bucket is None:
            bucket = TokenBucket(tenant.requests_per_s, float(tenant.burst), tenant.burst, now_s)
            self._buckets[tenant.tenant_id] = bucket
        wait_s = bucket.take(now_s)
        if wait_s > 0.0:
            raise QuotaExceeded(
                f"tenant {tenant.tenant_id} is over its quota of {tenant.requests_per_s:g}/s",
                retry_after_s=wait_s,
            )

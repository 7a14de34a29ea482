"""Per-tenant ``cache_salt``: the value vLLM mixes into every prefix-cache block hash.

Requests share cached KV only when their salts are equal, so one salt per tenant keeps tenants
from reading each other's cache (a cache hit is observable as a faster first token). vLLM asks for
a non-empty, unguessable value ("a random 256-bit value"): the salt is HMAC-SHA256 of the tenant
id under a cluster secret, 64 hex characters, so no one without the secret can compute another
tenant's salt, and every node and worker holding the secret computes the same one. The live path
must send exactly this salt (``GET /v1/conversations/{id}/route`` hands it out) or it never hits
what replay warmed.
"""

from __future__ import annotations

import hashlib
import hmac

from eventlog.errors import InvariantViolation

SALT_KEY_BYTES_MIN = 32  # the key is a 256-bit secret (services.replay.config.ReplayConfig)
_DOMAIN = b"convplane/cache-salt/v1\x00"  # keys derived for other uses never collide with this


def cache_salt_for(key: bytes, tenant_id: str) -> str:
    """The tenant's salt: 64 hex characters (256 bits), keyed by the cluster's salt key."""
    if len(key) < SALT_KEY_BYTES_MIN:
        raise InvariantViolation(f"cache-salt key must be >= {SALT_KEY_BYTES_MIN} bytes")
    return hmac.new(key, _DOMAIN + tenant_id.encode("utf-8"), hashlib.sha256).hexdigest()

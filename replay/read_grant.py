"""Read grants: what lets a replay worker read one transcript, and nothing else. Pure.

The region's replay service signs each job it dispatches with a grant: an HMAC-SHA256, under a
key only nodes hold (``ReplayConfig.read_grant_key``, derived from the cluster's peer secret),
over the job id, tenant, conversation, region and an expiry (the job's deadline). The worker
sends it with its transcript read (``X-Convplane-Replay-Grant``); the node checks the MAC, that
the read names the grant's tenant and conversation, that it has not expired, and that the
worker key belongs to the grant's region. A worker key alone therefore reads nothing: a grant
exists only for a job the plane scheduled, and a stolen key plus a grant of another region's
job is still refused.

Wire form: ``v1.<job id, base64url>.<region>.<expiry ms>.<mac, hex>`` (region names have no dot).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from eventlog.errors import Forbidden

READ_GRANT_HEADER = "X-Convplane-Replay-Grant"
#: a grant longer than this is refused unread (a job id is at most 512 characters)
READ_GRANT_CHARS_MAX = 1024
_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class ReadGrant:
    job_id: str
    region: str
    expires_ms: int


def _mac(
    key: bytes, job_id: str, tenant_id: str, conversation_id: str, region: str, expires_ms: int
) -> str:
    # length-prefixed fields: no two field lists sign the same bytes
    fields = (job_id, tenant_id, conversation_id, region, str(expires_ms))
    message = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    return hmac.new(key, b"convplane/read-grant/v1" + message, hashlib.sha256).hexdigest()


def sign(
    key: bytes, *, job_id: str, tenant_id: str, conversation_id: str, region: str, expires_ms: int
) -> str:
    encoded_id = base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")
    mac = _mac(key, job_id, tenant_id, conversation_id, region, expires_ms)
    return f"{_VERSION}.{encoded_id}.{region}.{expires_ms}.{mac}"


def verify(
    key: bytes, grant: str | None, *, tenant_id: str, conversation_id: str, now_ms: int
) -> ReadGrant:
    """The grant, if it is valid for reading this conversation now; ``Forbidden``
    (403) otherwise."""
    if not grant:
        raise Forbidden(
            "the replay worker key reads a transcript only with the read grant of a replay job "
            "the plane scheduled (X-Convplane-Replay-Grant)"
        )
    parts = grant.split(".") if len(grant) <= READ_GRANT_CHARS_MAX else []
    if len(parts) != 5 or parts[0] != _VERSION or not parts[3].isdigit():
        raise Forbidden("malformed read grant")
    _, encoded_id, region, expires_text, mac = parts
    try:
        job_id = base64.urlsafe_b64decode(encoded_id + "=" * (-len(encoded_id) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise Forbidden("malformed read grant") from exc
    expires_ms = int(expires_text)
    expected = _mac(key, job_id, tenant_id, conversation_id, region, expires_ms)
    if not hmac.compare_digest(mac, expected):
        raise Forbidden("the read grant is not for this tenant's conversation")
    if expires_ms <= now_ms:
        raise Forbidden("the read grant has expired (its replay job's deadline passed)")
    return ReadGrant(job_id=job_id, region=region, expires_ms=expires_ms)

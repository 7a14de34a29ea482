"""Authenticated records on the replay topics: what a worker or a node accepts from Kafka.

Anyone who can write to a topic could otherwise make a worker fetch another tenant's transcript
with the service key and prefill it (a forged job), or overwrite KV affinity (a forged result).
So every record is an envelope ::

    {"v": 1, "kind": "job" | "result", "region": r, "mac": hex, "body": {...}}

with ``mac = HMAC-SHA256(key of region r, "convplane-replay/v1" \\0 kind \\0 r \\0 body)``, body
as canonical JSON (sorted keys, no spaces). Each region has its own secret
(``ReplayConfig.bus_secrets``): its nodes and workers hold it, so a region's worker cannot forge
another region's jobs. A reader checks, in this order and before anything else is done: the
envelope's shape and size, that it holds the region's key (unknown region: rejected), the MAC
(constant-time), the body's ``region`` equal to the envelope's (and, for jobs, to the reader's
own region), then every field (``replay.bus.port``). Any failure is ``MalformedMessage`` or its
kind ``UnauthenticatedMessage``; consumers skip the record, count it, and commit past it.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any, Literal

from eventlog.errors import InvariantViolation
from replay.bus.port import (
    MalformedMessage,
    UnauthenticatedMessage,
    job_body,
    job_from_body,
    result_body,
    result_from_body,
)
from replay.model import ReplayJob, ReplayResult

RECORD_BYTES_MAX = 64 * 1024  # a job or result is a few hundred bytes
BUS_SECRET_BYTES_MIN = 32
_DOMAIN = b"convplane-replay/v1"

Kind = Literal["job", "result"]


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, kind: str, region: str, body: bytes) -> str:
    message = b"\0".join((_DOMAIN, kind.encode(), region.encode(), body))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class ForeignRegionRecord(MalformedMessage):
    """A result of a region whose secret this reader does not hold (the results topic is
    shared): not checkable, and of no concern to this reader; skipped quietly."""

    code = "foreign_region_record"


class BusCodec:
    """Signs and checks records with per-region keys (region -> secret bytes)."""

    def __init__(self, region_keys: Mapping[str, bytes]) -> None:
        if any(len(k) < BUS_SECRET_BYTES_MIN for k in region_keys.values()):
            raise InvariantViolation(f"replay bus secrets must be >= {BUS_SECRET_BYTES_MIN} bytes")
        self._keys = dict(region_keys)

    def encode_job(self, job: ReplayJob) -> bytes:
        return self._encode("job", job.region, job_body(job))

    def encode_result(self, result: ReplayResult) -> bytes:
        return self._encode("result", result.region, result_body(result))

    def decode_job(self, raw: bytes | None, region: str) -> ReplayJob:
        """A job for ``region`` (the reader's): anything else is rejected."""
        body = self._verified(raw, "job")
        job = job_from_body(body)
        if job.region != region:
            raise UnauthenticatedMessage(f"job for region {job.region!r} on {region}'s topic")
        return job

    def decode_result(self, raw: bytes | None) -> ReplayResult:
        return result_from_body(self._verified(raw, "result"))

    def _encode(self, kind: Kind, region: str, body: Mapping[str, Any]) -> bytes:
        key = self._keys.get(region)
        if key is None and kind == "result":
            raise ForeignRegionRecord(f"result of region {region!r}, whose secret is not held")
        if key is None:
            raise InvariantViolation(f"no replay bus secret for region {region!r}")
        canonical = _canonical(body)
        envelope = {
            "v": 1,
            "kind": kind,
            "region": region,
            "mac": _mac(key, kind, region, canonical),
        }
        # the body goes in verbatim (canonical), so the reader MACs exactly these bytes' value
        return json.dumps(
            {**envelope, "body": body}, sort_keys=True, separators=(",", ":")
        ).encode()

    def _verified(self, raw: bytes | None, kind: Kind) -> object:
        if raw is None or len(raw) > RECORD_BYTES_MAX:
            raise MalformedMessage(f"{kind}: empty or over {RECORD_BYTES_MAX} bytes")
        try:
            envelope = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedMessage(f"{kind}: not JSON") from exc
        if not isinstance(envelope, dict) or envelope.get("v") != 1 or envelope.get("kind") != kind:
            raise UnauthenticatedMessage(f"{kind}: not a signed {kind} envelope")
        region, mac, body = envelope.get("region"), envelope.get("mac"), envelope.get("body")
        if not isinstance(region, str) or not isinstance(mac, str) or not isinstance(body, dict):
            raise UnauthenticatedMessage(f"{kind}: no region, MAC or body")
        key = self._keys.get(region)
        if key is None and kind == "result":
            raise ForeignRegionRecord(f"result of region {region!r}, whose secret is not held")
        if key is None:
            raise UnauthenticatedMessage(f"{kind}: unknown region or no MAC")
        expected = _mac(key, kind, region, _canonical(body))
        if not hmac.compare_digest(expected, mac):
            raise UnauthenticatedMessage(f"{kind}: bad MAC (forged or tampered)")
        if body.get("region") != region:
            raise UnauthenticatedMessage(f"{kind}: body region differs from the signed region")
        return body

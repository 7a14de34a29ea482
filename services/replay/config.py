"""Replay settings in the cluster file (``ClusterConfig.replay``): engines per region, the replay
window, headroom, operator rate limits, Kafka (optional) and the service API key.

Without ``kafka_bootstrap_servers`` every node runs its region's replay workers in process (one
per configured engine) on the in-process job bus; with it, jobs go to Kafka and external
``convplane worker`` processes (one per engine) take them.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

#: the region of the legacy shared worker key (``service_api_key_sha256``): every region's jobs
ANY_REGION = "*"
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class EngineConfig(BaseModel):
    """One inference engine (a vLLM replica, or the simulator) of a region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="base URL of the engine's OpenAI-compatible server")
    model_revision: str = Field(min_length=1, description="the revision it serves (= model id)")
    #: its prefill capacity, until its own metrics measure it
    capacity_tokens_per_s: float = Field(default=20_000.0, gt=0.0)
    #: names the engine in results and affinity; default ``<region>-e<index>``
    engine_id: str | None = None
    #: the operator declares that the engine runs ``--scheduling-policy priority``: it counts
    #: where the self-check's queue probe cannot tell, never over an engine seen serving FCFS.
    #: Unverified and undeclared, its in-node worker takes
    #: ``CapacityConfig.unverified_priority_share`` of the spare, and only while no live
    #: request is in the engine
    priority_scheduling_declared: bool = False


class ReplayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: region -> its inference engines (each with a replay worker)
    engines: dict[str, list[EngineConfig]] = Field(default_factory=dict)
    #: conversations active within this window are replayed when their shard moves
    replay_window_s: float = Field(default=3600.0, gt=0.0)
    #: a replay job not done within this is dropped (its conversation's next turn prefills)
    job_ttl_s: float = Field(default=1800.0, gt=0.0)
    #: fraction of each engine's capacity never given to replay
    headroom: float = Field(default=0.1, ge=0.0, lt=1.0)
    #: operator caps (tokens/s): the whole region, one tenant (default and per tenant)
    region_tokens_per_s: float | None = Field(default=None, gt=0.0)
    #: a tenant's replay cap (tokens/s) when tenant_tokens_per_s names none
    tenant_default_tokens_per_s: float | None = Field(default=None, gt=0.0)
    #: tenant -> its replay cap (tokens/s)
    tenant_tokens_per_s: dict[str, float] = Field(default_factory=dict)
    #: tenant -> its weight when replay orders the moved conversations (default 1)
    tenant_weights: dict[str, float] = Field(default_factory=dict)
    #: replays in flight per worker (= per engine)
    worker_concurrency: int = Field(default=2, ge=1, le=64)
    #: conversations waiting for replay in a region; more are not queued
    backlog_max: int = Field(default=200_000, ge=1)
    #: conversations listed per moved shard (the replica lists most recent first)
    conversations_per_shard_max: int = Field(default=5_000, ge=1)
    #: KV affinities remembered by a node (LRU)
    affinity_max: int = Field(default=100_000, ge=1)
    #: Kafka brokers (host:port,...) for replay jobs; absent: in-process workers
    kafka_bootstrap_servers: str | None = None
    #: how nodes connect to Kafka (aiokafka's options; workers take the same as CLI options)
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: the CA that signs the brokers' certificates (PEM; SSL, SASL_SSL)
    kafka_ssl_cafile: str | None = None
    #: the node's client certificate and key for the brokers (PEM; mutual TLS)
    kafka_ssl_certfile: str | None = None
    #: (see kafka_ssl_certfile)
    kafka_ssl_keyfile: str | None = None
    #: how a SASL client proves itself (SASL_PLAINTEXT, SASL_SSL)
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    #: the node's SASL user
    kafka_sasl_username: str | None = None
    #: the node's SASL password
    kafka_sasl_password: str | None = None
    #: region -> 256-bit secret (64 hex) that signs the region's replay jobs and results on
    #: Kafka (``replay.bus.codec``); a region's workers get only their region's. Required for
    #: every region with engines when Kafka is configured.
    bus_secrets: dict[str, Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=dict
    )
    #: region -> the key that region's replay workers present to read transcripts on behalf
    #: of a tenant (``X-Convplane-Tenant``), each read with the read grant of a job of that
    #: region (``replay.read_grant``): a stolen worker key is one region's problem
    worker_keys_sha256: dict[str, Sha256Hex] = Field(default_factory=dict)
    #: legacy: one worker key for every region (prefer ``worker_keys_sha256``); it still reads
    #: only with a read grant
    service_api_key_sha256: Sha256Hex | None = None
    #: 256-bit secret (64 hex) under which each tenant's ``cache_salt`` is derived
    #: (``replay.cache_salt``); nodes and workers must share it. Absent: derived from the
    #: cluster's ``peer_secret``; without that too, a fixed development key (salts still differ
    #: per tenant, but anyone can compute them: never in production)
    cache_salt_key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None

    @model_validator(mode="after")
    def _check(self) -> ReplayConfig:
        if any(w <= 0 for w in self.tenant_weights.values()):
            raise ValueError("tenant weights must be > 0")
        if any(r <= 0 for r in self.tenant_tokens_per_s.values()):
            raise ValueError("tenant rates must be > 0")
        worker_keys = [*self.worker_keys_sha256.values(), self.service_api_key_sha256]
        if len(set(worker_keys)) != len(worker_keys):
            raise ValueError("each region's workers need a key of their own")
        unsigned = sorted(set(self.engines) - set(self.bus_secrets))
        if self.kafka_bootstrap_servers and unsigned:
            raise ValueError(
                f"bus_secrets needs a secret for every region with engines: {unsigned}"
            )
        return self

    def worker_key_regions(self) -> dict[str, str]:
        """Worker key sha256 -> the region whose jobs it reads for (``ANY_REGION``: the legacy
        shared key)."""
        regions = {sha: region for region, sha in self.worker_keys_sha256.items()}
        if self.service_api_key_sha256 is not None:
            regions[self.service_api_key_sha256] = ANY_REGION
        return regions

    def bus_keys(self) -> dict[str, bytes]:
        return {region: bytes.fromhex(secret) for region, secret in self.bus_secrets.items()}

    def salt_key(self, peer_secret: str | None) -> bytes:
        """The key of ``replay.cache_salt.cache_salt_for`` (see ``cache_salt_key``)."""
        if self.cache_salt_key is not None:
            return bytes.fromhex(self.cache_salt_key)
        secret = (peer_secret or "convplane development cache-salt key").encode()
        return hmac.new(secret, b"convplane/cache-salt-key/v1", hashlib.sha256).digest()

    def read_grant_key(self, peer_secret: str | None) -> bytes:
        """The key that signs replay jobs' read grants (``replay.read_grant``): nodes only,
        never workers (a worker holding it could grant itself any transcript)."""
        secret = (peer_secret or "convplane development read-grant key").encode()
        return hmac.new(secret, b"convplane/read-grant-key/v1", hashlib.sha256).digest()

    def region_engines(self, region: str) -> list[tuple[str, EngineConfig]]:
        """The region's engines with their ids."""
        return [
            (e.engine_id or f"{region}-e{i}", e) for i, e in enumerate(self.engines.get(region, []))
        ]

"""Settings of a region node: the cluster file every node shares, plus this node's own limits.

The cluster file is JSON (``ClusterConfig``): the regions (name, public URL, the DSN of that
region's replica database as any node sees it, capacity weight), the log's shard count and write
quorum, and the tenants (API keys as sha256 hex, never in clear). ``NodeSettings`` names the
file and this node's region; its limits can also come from ``CONVPLANE_*`` environment variables.
Loading is explicit (``load_cluster``): nothing here reads a file at import time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from eventlog.errors import InvalidRequest
from regions.keys import Role, check_name
from services.replay.config import ReplayConfig

RegionName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


def api_key_sha256(api_key: str) -> str:
    """The form in which API keys are stored in the cluster file."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


class NodeAddress(BaseModel):
    """Where one further node of a region listens (``RegionConfig.more_nodes``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="base URL of the node's client listener")
    #: the node's peer listener (absent: peers use ``url``)
    peer_url: str | None = None


class RegionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the region's name: lower-case letters, digits and dashes, at most 63
    name: RegionName
    url: str = Field(description="base URL of the region's node, e.g. http://127.0.0.1:8700")
    dsn: str = Field(description="the region's replica database, as seen from any node")
    #: the region's share of shards in placement (rendezvous hashing weighted by it) and of
    #: capacity in the planner's arithmetic; 0 places no shard there
    capacity_weight: float = Field(default=1.0, ge=0.0)
    #: per-source overrides: the DSN / URL a node of region ``source`` uses to reach this
    #: region (e.g. through a fault proxy in chaos tests); absent: ``dsn`` / ``url``
    dsn_from: dict[str, str] = Field(default_factory=dict)
    #: per-source overrides of ``url`` (see ``dsn_from``)
    url_from: dict[str, str] = Field(default_factory=dict)
    #: the node's peer listener (probes, placement, forwards; ``services.listeners``): its own
    #: connection limits, so client connections cannot starve it. Absent: peers use ``url``.
    peer_url: str | None = None
    #: the region's further nodes (its first is at ``url`` / ``peer_url``): they share its
    #: replica database and split the region's shards by node slot, each led by the node
    #: holding the slot's lease; a node takes over a dead sibling's slot
    #: (``services.control.node_slots``)
    more_nodes: list[NodeAddress] = Field(default_factory=list, max_length=15)

    @model_serializer(mode="wrap")
    def _without_empty_more_nodes(self, serialize: SerializerFunctionWrapHandler) -> Any:
        """A region of one node is written as before ``more_nodes`` existed: a node of an
        earlier release (which forbids unknown fields) still reads a cluster file this
        release wrote, during a rolling upgrade or after a rollback."""
        data = serialize(self)
        if isinstance(data, dict) and not self.more_nodes:
            data.pop("more_nodes", None)
        return data

    def peer_url_for(self, source: str) -> str:
        """The URL a node of region ``source`` uses for peer traffic to this region's first
        node: a per-source override (``url_from``: a fault proxy) first, then the peer
        listener."""
        return self.url_from.get(source) or self.peer_url or self.url

    @property
    def node_count(self) -> int:
        return 1 + len(self.more_nodes)

    def node_peer_urls(self, source: str) -> list[str]:
        """Every node's peer URL as a node of region ``source`` reaches it, the first node
        first (``peer_url_for``; the further nodes have no per-source overrides)."""
        return [self.peer_url_for(source)] + [n.peer_url or n.url for n in self.more_nodes]

    def node_urls(self) -> list[str]:
        """Every node's client URL, the first node first."""
        return [self.url] + [n.url for n in self.more_nodes]


class TenantConfig(BaseModel):
    """One API key: its tenant, role and quota. ``key_name`` names it for revoke and rotate
    (default: the tenant id); names and tenant ids follow ``regions.keys.check_name``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the tenant the key acts for: every read and write is scoped to it
    tenant_id: str
    #: the key's SHA-256 (hex); the key itself is never stored
    api_key_sha256: Sha256Hex
    #: the key's quota: a token bucket of requests_per_s with room for burst
    requests_per_s: float = Field(default=100.0, gt=0.0)
    #: the token bucket's size (see requests_per_s)
    burst: int = Field(default=200, ge=1)
    #: tenant (chat applications), operator (drills, evacuate/restore, halt, keys) or viewer
    #: (reads only)
    role: Role = "tenant"
    #: names the key for ``convplane keys rotate|revoke`` (default: the tenant id)
    key_name: str | None = None

    @field_validator("tenant_id", "key_name")
    @classmethod
    def _named(cls, name: str | None, info: ValidationInfo) -> str | None:
        try:
            return None if name is None else check_name(info.field_name or "name", name)
        except InvalidRequest as exc:
            raise ValueError(exc.message) from exc

    @property
    def name(self) -> str:
        return self.key_name or self.tenant_id


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: every region of the plane, each with its node and its replica database
    regions: list[RegionConfig] = Field(min_length=1)
    #: shards of the log, fixed when the plane is created: leadership, epochs and failover
    #: are per shard
    shard_count: int = Field(default=64, ge=1, le=65_536)
    #: replicas that must hold an event before it is acknowledged (absent: a majority)
    write_quorum: int | None = Field(default=None, ge=1)
    #: the API keys in the file (more are created on a running plane: ``convplane keys``)
    tenants: list[TenantConfig] = Field(default_factory=list)
    #: the model revision of a conversation created without one
    default_model_revision: str = "default"
    #: shared by the nodes: a forward carries it (X-Convplane-Peer-Auth) so the leader knows the
    #: entry node charged the tenant. Absent: no forward is trusted (each hop is charged).
    peer_secret: str | None = Field(default=None, min_length=32, max_length=256)
    #: the plane was started by ``convplane up``, whose supervisor kills and restarts a region's
    #: processes for ``kill`` drills (services.control.drills.local_kill); nothing else can
    local_supervisor: bool = False
    #: engines per region, replay window, limits, Kafka, service key (services.replay.config)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        names = [r.name for r in self.regions]
        if len(set(names)) != len(names):
            raise ValueError("region names must be unique")
        if self.write_quorum is not None and self.write_quorum > len(self.regions):
            raise ValueError("write_quorum exceeds the number of regions")
        keys = [t.api_key_sha256 for t in self.tenants]
        if len(set(keys)) != len(keys):
            raise ValueError("two tenants share an API key")
        key_names = [t.name for t in self.tenants]
        taken = sorted({n for n in key_names if key_names.count(n) > 1})
        if taken:
            raise ValueError(f"two keys are named {taken} (give each a key_name of its own)")
        return self

    def region(self, name: str) -> RegionConfig:
        for r in self.regions:
            if r.name == name:
                return r
        raise ValueError(f"region {name!r} is not in the cluster file")

    def weights(self) -> dict[str, float]:
        return {r.name: r.capacity_weight for r in self.regions}


def load_cluster(path: Path) -> ClusterConfig:
    return ClusterConfig.model_validate(json.loads(path.read_text(encoding="utf-8")))


def write_cluster(path: Path, cluster: ClusterConfig) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.touch(mode=0o600)  # it holds the peer secret: readable by the nodes' user only
    tmp.chmod(0o600)
    tmp.write_text(cluster.model_dump_json(indent=2), encoding="utf-8")
    tmp.replace(path)


class NodeSettings(BaseSettings):
    """One region node. ``cluster`` may be given directly (tests); else ``cluster_file`` is read."""

    model_config = SettingsConfigDict(env_prefix="CONVPLANE_", extra="forbid")

    #: this node's region, as the cluster file names it
    region: str
    #: which of the region's nodes this is: 0 the one at the region's ``url``, 1.. its
    #: ``more_nodes`` in order
    node_index: int = Field(default=0, ge=0)
    #: the cluster file (JSON) every node of the plane shares
    cluster_file: Path | None = None
    #: the cluster given directly instead of a file (tests, embedding)
    cluster: ClusterConfig | None = None

    #: largest request body accepted (Content-Length and streamed bytes)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    #: an events page holds at most this many bytes of events (services.api.paging); at least
    #: one event always, so keep it above max_body_bytes
    events_page_bytes_max: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    #: largest serialized ``metadata`` of a conversation
    max_metadata_bytes: int = Field(default=16 * 1024, ge=64)
    #: the most /v1 requests under way in this node: the adaptive limit's ceiling
    max_in_flight: int = Field(default=512, ge=1)
    #: admission (services.api.admission): the adaptive concurrency limit starts at
    #: admission_limit_initial and stays within [admission_limit_min, max_in_flight] (both capped
    #: at max_in_flight); latency up to admission_tolerance x the baseline (the minimum over
    #: admission_baseline_window_s) counts as no queueing. Past the limit at most
    #: admission_queue_max requests wait, each until its deadline; the rest get 503 overloaded.
    #: Waiters are swept every admission_sweep_s.
    admission_limit_initial: int = Field(default=32, ge=1)
    #: floor of the adaptive limit: below it nothing queues. The gradient's baseline is the
    #: fastest request seen (a local read), so mixed reads, appends and forwards read as
    #: "queueing" at small concurrency; a floor of 32 keeps that from throttling a healthy node
    #: (measured: at a floor of 4, appends queued to their deadline during failovers)
    admission_limit_min: int = Field(default=32, ge=1)
    admission_tolerance: float = Field(default=4.0, ge=1.0)
    admission_baseline_window_s: float = Field(default=60.0, gt=0.0)
    admission_queue_max: int = Field(default=128, ge=0)
    admission_sweep_s: float = Field(default=0.05, gt=0.0)
    #: hostile connections (services.listeners): the client listener keeps at most
    #: client_connections_max connections (past it the oldest idle one is closed); a connection
    #: must send a whole request head within header_timeout_s of connecting or of its previous
    #: response, else it is closed. The peer listener has its own peer_connections_max (at least
    #: two per peer region: ``load_cluster`` refuses fewer).
    client_connections_max: int = Field(default=2048, ge=1)
    peer_connections_max: int = Field(default=256, ge=1)
    header_timeout_s: float = Field(default=5.0, gt=0.0)
    #: a request head (request line and headers) longer than this is answered 431 and its
    #: connection closed: the HTTP parser's cost grows with the square of a header's length
    header_bytes_max: int = Field(default=64 * 1024, ge=4096)
    #: a request body must arrive within this (and the request's deadline), before admission
    body_read_timeout_s: float = Field(default=5.0, gt=0.0)
    #: a client must take each response message within this, else its connection is closed
    #: (and its admission permit given back)
    send_timeout_s: float = Field(default=10.0, gt=0.0)
    #: an over-limit body is read and discarded up to this many bytes so that the client can
    #: read its 413 (past it the connection is closed after the 413 is written)
    discard_body_max_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    #: mutual TLS on the peer listener and on every peer call (services.cluster_tls): the
    #: cluster CA, this node's certificate and key (PEM). All three or none.
    tls_ca_file: Path | None = None
    #: this node's certificate (PEM), naming its region (see tls_ca_file)
    tls_cert_file: Path | None = None
    #: the certificate's private key (PEM; see tls_ca_file)
    tls_key_file: Path | None = None
    #: a node refuses a cluster file with secrets published in the repository unless this is
    #: set (a throwaway demo): services.deploy.compose_secrets.refuse_demo_secrets
    allow_demo_secrets: bool = False
    #: /peer requests (probes, placement) under way at once; beyond it 503
    peer_in_flight_max: int = Field(default=64, ge=1)
    #: deadline of a request that sends no X-Convplane-Deadline-Ms
    default_deadline_ms: int = Field(default=10_000, ge=1)
    #: the longest deadline a caller may ask for
    max_deadline_ms: int = Field(default=60_000, ge=1)
    #: a forwarded request is retried this often when the peer could not be reached at all
    forward_retries_max: int = Field(default=1, ge=0, le=5)
    #: the pause before a forward is retried (see forward_retries_max)
    forward_backoff_s: float = Field(default=0.05, gt=0.0)
    #: a forward's connection (TCP and TLS handshake) must be made within this: past it
    #: nothing was sent, and the node is passed over as one that refused (a host whose packets
    #: are dropped never refuses), so the retry goes to a sibling that answers probes
    forward_connect_timeout_s: float = Field(default=0.5, gt=0.0)
    #: connections kept to each peer region
    forward_connections_max: int = Field(default=64, ge=1)
    #: forwarded appends travel to their leader in batches (services.api.forward_batch): at
    #: most this many per batch, this many batches under way per peer region (a batch
    #: unanswered after forward_batch_straggler_s no longer counts, but stays among the
    #: forward_batches_open_max open ones), and this many appends waiting (else 503 overloaded)
    forward_batch_max: int = Field(default=64, ge=1, le=256)
    #: forward batches under way at once to one peer region (see forward_batch_max)
    forward_batches_in_flight_max: int = Field(default=1, ge=1)
    forward_batch_straggler_s: float = Field(default=0.1, gt=0.0)
    forward_batches_open_max: int = Field(default=16, ge=1)
    #: forwarded appends waiting for a batch; past it 503 overloaded (see forward_batch_max)
    forward_queue_max: int = Field(default=1024, ge=1)
    #: leading the shards placed on this region: attempts and backoff (jittered, doubling)
    lead_attempts_max: int = Field(default=1_000, ge=1)
    #: the first pause between attempts to lead a shard (see lead_attempts_max)
    lead_backoff_min_s: float = Field(default=0.05, gt=0.0)
    #: the longest pause between attempts to lead a shard
    lead_backoff_max_s: float = Field(default=2.0, gt=0.0)
    #: shards this node prepares (and recovers) concurrently, at startup and when a failover
    #: hands it a failed region's shards: a survivor of a 3-region plane of 64 shards takes
    #: ~11; bench/drills.py on 64 shards, 12 writers: RTO max median 2.67 s at 8, 2.43 s at 32
    lead_concurrency_max: int = Field(default=32, ge=1)
    #: the retry hint sent with 503s that carry none of their own
    retry_after_default_s: float = Field(default=1.0, gt=0.0)
    #: failure detection (services.control.controller, regions.membership): probe every peer this often,
    #: each probe under this timeout; a peer without a successful probe for detection_s is
    #: suspected (a peer never heard from: not before never_seen_grace_s after start)
    probe_interval_s: float = Field(default=0.2, gt=0.0)
    #: one probe's timeout (see probe_interval_s)
    probe_timeout_s: float = Field(default=0.5, gt=0.0)
    detection_s: float = Field(default=1.0, gt=0.0)
    never_seen_grace_s: float = Field(default=5.0, ge=0.0)
    #: how often a node learns the committed placement and reconciles its leadership
    placement_poll_s: float = Field(default=0.1, gt=0.0)
    #: in a region of several nodes: how often a node asks for the node slot leases it may
    #: take, and checks that it still holds its own (``services.control.node_slots``)
    region_lease_poll_s: float = Field(default=0.1, gt=0.0)
    #: one replica read of the control shard
    control_read_timeout_s: float = Field(default=1.0, gt=0.0)
    #: failback: a region must be up this long; then at most N shards move per step
    failback_hysteresis_s: float = Field(default=60.0, ge=0.0)
    #: shards moved back per failback step
    failback_shards_per_step: int = Field(default=4, ge=1)
    #: the pause between failback steps
    failback_step_interval_s: float = Field(default=1.0, ge=0.0)
    #: a planned handoff waits at most this long for the old leader to stop first
    handoff_wait_s: float = Field(default=2.0, ge=0.0)
    #: the control shard: a node that has deferred it to another region for this long without
    #: hearing that region lead it passes that region over (regions.control_succession) until
    #: it leads or its own choice changes: two nodes that name each other (a standoff) or a
    #: successor that cannot lead end within this bound. Far above a lead's prepare and
    #: recovery (``LogConfig.lead_timeout_s``) and detection, so a healthy handoff never hits it
    control_handoff_wait_s: float = Field(default=10.0, gt=0.0)
    #: acknowledged appends per second one region sustains: a drill's preflight refuses when
    #: the survivors of a region loss would need more (regions.drill_plan)
    region_append_capacity_per_s: float = Field(default=2000.0, gt=0.0)
    #: the control leader re-evaluates every region's loss readiness this often (regions.readiness)
    readiness_interval_s: float = Field(default=300.0, gt=0.0)
    #: readiness: a passed drill's weight in the score halves every this many seconds (7 days)
    readiness_drill_half_life_s: float = Field(default=604_800.0, gt=0.0)
    #: readiness: a replay bound of the moved conversations up to this many seconds scores full
    readiness_replay_target_s: float = Field(default=300.0, gt=0.0)
    #: practice runs (services.control.practice): how often the control leader decides
    #: whether a schedule starts, skips or waits
    practice_tick_s: float = Field(default=5.0, gt=0.0)
    #: practice runs: no start this long after the placement changed (a failover, failback
    #: or evacuation); the skip is recorded with the reason
    practice_failover_quiet_s: float = Field(default=600.0, ge=0.0)
    #: practice runs: the seed of each window's chance draw (regions.practice.window_draw)
    practice_seed: int = 0
    #: practice runs: the plane's own availability SLO, the share of live client appends
    #: answered without a 5xx (4xx count neither way); its error budget is 1 minus it
    #: (regions.error_budget)
    practice_slo_availability: float = Field(default=0.999, gt=0.0, lt=1.0)
    #: practice runs: the window the error-budget burn is measured over (s); it is judged once
    #: the control leader's samples span half of it
    practice_burn_window_s: float = Field(default=3600.0, gt=0.0)
    #: practice runs: a burn rate (5xx ratio over the window / (1 - SLO)) above this blocks a
    #: start and aborts a running practice drill; 14.4 spends 2 % of a 30-day budget in an hour
    practice_burn_rate_max: float = Field(default=14.4, gt=0.0)
    #: practice runs: with fewer live appends than this ended in the window the burn is not
    #: judged (an idle plane's few errors say nothing about its budget)
    practice_burn_min_appends: int = Field(default=1000, ge=1)
    #: where an operator's browser reaches each region's client API, for the console
    #: (services.console.access), when not at the cluster file's ``url`` (docker compose
    #: publishes nodes on host ports); JSON in CONVPLANE_CONSOLE_URLS, region -> URL
    console_urls: dict[str, str] = Field(default_factory=dict)
    #: the operators' Grafana dashboard (deploy/observability/grafana), linked from the console's
    #: top bar when set (http or https URL); CONVPLANE_DASHBOARD_URL
    dashboard_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://\S+$")

    @model_validator(mode="after")
    def _tls_all_or_none(self) -> NodeSettings:
        given = [f is not None for f in (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)]
        if any(given) and not all(given):
            raise ValueError("tls_ca_file, tls_cert_file and tls_key_file go together")
        return self

    def load_cluster(self) -> ClusterConfig:
        if self.cluster is not None:
            cluster = self.cluster
        elif self.cluster_file is not None:
            cluster = load_cluster(self.cluster_file)
        else:
            raise ValueError("NodeSettings needs cluster or cluster_file")
        nodes = cluster.region(self.region).node_count  # the node's own region must be listed
        if self.node_index >= nodes:
            raise ValueError(
                f"node_index {self.node_index}: region {self.region} has {nodes} node(s) in "
                "the cluster file (its url and its more_nodes)"
            )
        peer_connections_min = 2 * (len(cluster.regions) - 1)
        if self.peer_connections_max < peer_connections_min:
            raise ValueError(
                f"peer_connections_max {self.peer_connections_max} is below "
                f"{peer_connections_min}, two per peer region: each peer's probes and its "
                "forwards want a connection, and past the cap the peer listener closes the "
                "oldest idle one, so they would keep closing each other's and reconnecting "
                "(at 1 in a 3-region plane, the plane could not route)"
            )
        return cluster

"""Prometheus metrics of one node, in a registry of its own (no global state across apps)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from eventlog.identity import IdentityGuard
from services.api.errors import ERROR_CODES
from services.supervisor import Supervisor

#: the methods that get a label of their own; any other token is counted as "other"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, region: str) -> None:
        self.region = region
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "convplane_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "convplane_http_request_duration_seconds",
            "HTTP request latency by route template and method",
            ["route", "method"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        # Labelled with this node's region, so a dashboard sums them per shard-leader region;
        # its _count is the number of acknowledged appends.
        self.ack_latency = Histogram(
            "convplane_append_ack_latency_seconds",
            "time from receiving an append to its quorum acknowledgment, at the shard's leader",
            ["leader_region"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.forwarded = Counter(
            "convplane_forwarded_requests",
            "requests forwarded to the shard leader's region, by target region and outcome",
            ["target_region", "outcome"],
            registry=self.registry,
        )
        self.forward_latency = Histogram(
            "convplane_forward_duration_seconds",
            "time from sending a request to the leader's region to its answer (answered ones)",
            ["target_region"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.errors = Counter(
            "convplane_request_errors",
            "requests refused or failed with a convplane error, by its stable code",
            ["code"],
            registry=self.registry,
        )
        self.fenced_writes = Counter(
            "convplane_fenced_writes",
            "writes refused because a newer leader (higher epoch) took the shard",
            registry=self.registry,
        )
        self._ack = self.ack_latency.labels(region)
        self._forward: dict[str, Histogram] = {}
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._error: dict[str, Counter] = {}

    def watch_loops(self, supervisor: Supervisor) -> None:
        """Export the supervised loops' crash counts and crash-looping state at each scrape."""
        self.registry.register(_LoopCollector(supervisor))

    def watch_replicas(self, identity: IdentityGuard) -> None:
        """Export which replicas are quarantined (``eventlog.identity``) at each scrape."""
        self.registry.register(_ReplicaCollector(identity))

    def observe_request(self, route: str, method: str, status: int, latency_s: float) -> None:
        """``method`` is any token a client sent (HTTP allows any): unknown ones are "other".
        Every label is bounded (route templates, known methods, statuses), and so are the
        children cached per combination (resolving labels is most of an observation's cost)."""
        children = self._request_children.get((route, method, status))
        if children is None:
            method_label = method if method in HTTP_METHODS else "other"
            children = (
                self.requests.labels(route, method_label, str(status)),
                self.request_latency.labels(route, method_label),
            )
            if method_label == method:  # "other" is not cached by the raw token
                self._request_children[(route, method, status)] = children
        count, latency = children
        count.inc()
        latency.observe(latency_s)

    def observe_ack(self, latency_s: float) -> None:
        self._ack.observe(latency_s)

    def observe_forward(self, target_region: str, latency_s: float) -> None:
        """``target_region`` comes from the cluster file (bounded): children are cached."""
        child = self._forward.get(target_region)
        if child is None:
            child = self._forward[target_region] = self.forward_latency.labels(target_region)
        child.observe(latency_s)

    def count_error(self, code: str) -> None:
        """``code`` is a stable error code; one not in ``ERROR_CODES`` is counted as "other"."""
        code = code if code in ERROR_CODES else "other"
        child = self._error.get(code)
        if child is None:
            child = self._error[code] = self.errors.labels(code)
        child.inc()
        if code == "fenced":
            self.fenced_writes.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LoopCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        crashes = CounterMetricFamily(
            "convplane_background_loop_crashes",
            "crashes of a supervised background loop (each was restarted with backoff)",
            labels=["loop"],
        )
        looping = GaugeMetricFamily(
            "convplane_background_loop_crash_looping",
            "1 while a background loop has stopped or crashes on every run",
            labels=["loop"],
        )
        unhealthy = set(self._supervisor.unhealthy())
        for health in self._supervisor.loops():
            crashes.add_metric([health.name], health.crashes)
            looping.add_metric([health.name], 1.0 if health.name in unhealthy else 0.0)
        yield crashes
        yield looping


class _ReplicaCollector(Collector):
    def __init__(self, identity: IdentityGuard) -> None:
        self._identity = identity

    def collect(self) -> Iterator[GaugeMetricFamily]:
        quarantined = GaugeMetricFamily(
            "convplane_replica_quarantined",
            "1 while a region's replica is quarantined: its identity is not the one the cluster "
            "knows (lost or re-provisioned database); it neither votes nor acks until rebuilt",
            labels=["region"],
        )
        for region, verdict in sorted(self._identity.verdicts.items()):
            quarantined.add_metric([region], 1.0 if verdict.state == "quarantined" else 0.0)
        yield quarantined

"""The replay service's Prometheus metrics, read from its state at scrape time (a custom
collector in the node's own registry: no second copy of the numbers to keep in step)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.replay.service import ReplayService


class ReplayCollector(Collector):
    def __init__(self, service: ReplayService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        snap = service.scheduler.snapshot()
        region = service.capacity.region.snapshot()
        gauges = {
            "backlog_sessions": ("conversations queued for replay", snap.backlog_sessions),
            "backlog_tokens": ("estimated prompt tokens queued for replay", snap.backlog_tokens),
            "replayed_tokens_per_second": (
                "prompt tokens replayed per second (recent window)",
                snap.replayed_tokens_per_s,
            ),
            "spare_tokens_per_second": (
                "spare prefill tokens/s of the region's engines for replay",
                region.spare_tokens_per_s,
            ),
            "jobs_in_flight": ("replay jobs dispatched and not finished", region.in_flight),
            "affinity_entries": ("conversations with a known warm engine", len(service.affinity)),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"convplane_replay_{name}", doc, value=value)
        counters = {
            "dispatched": ("replay jobs dispatched", snap.dispatched_total),
            "replayed": ("conversations replayed", snap.replayed_total),
            "replayed_tokens": ("prompt tokens replayed", snap.replayed_tokens_total),
            "expired": ("replay jobs expired before they ran", snap.expired_total),
            "cancelled_live": (
                "queued replays dropped because a live request came first",
                snap.cancelled_live_total,
            ),
            "rejected_full": ("replays refused: backlog full", snap.rejected_full_total),
            "outside_window": ("moved conversations outside the window", snap.outside_window_total),
            "bus_results_rejected": (
                "result records rejected on the bus (failed their MAC or validation)",
                service.status_bus_rejected(),
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"convplane_replay_{name}", doc, value=value)
        not_replayed = CounterMetricFamily(
            "convplane_replay_not_replayed",
            "moved conversations no engine of the region can replay, by reason",
            labels=["reason"],
        )
        for reason in ("no_engine", "model_unserved"):
            not_replayed.add_metric([reason], service.counts[f"not_replayed_{reason}"])
        yield not_replayed
        yield from self._per_engine(service)
        results = CounterMetricFamily(
            "convplane_replay_results", "replay results by status", labels=["status"]
        )
        for key, value in sorted(service.counts.items()):
            if key.startswith("result_"):
                results.add_metric([key.removeprefix("result_")], value)
        yield results

    @staticmethod
    def _per_engine(service: ReplayService) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "convplane_replay_engine_live_tokens_per_second",
            "live prefill demand of an engine (computed prompt tokens/s, from its metrics)",
            labels=["engine"],
        )
        spare = GaugeMetricFamily(
            "convplane_replay_engine_spare_tokens_per_second",
            "spare prefill tokens/s of an engine",
            labels=["engine"],
        )
        unknown = GaugeMetricFamily(
            "convplane_replay_engine_unknown",
            "1 while an engine's capacity is unknown (metrics missing or unreachable): no replay",
            labels=["engine"],
        )
        for engine_id, controller in sorted(service.capacity.engine_controllers.items()):
            snapshot = controller.snapshot()
            live.add_metric([engine_id], snapshot.live_tokens_per_s)
            spare.add_metric([engine_id], snapshot.spare_tokens_per_s)
            unknown.add_metric([engine_id], float(engine_id in service.capacity.unknown_reasons))
        unfit = GaugeMetricFamily(
            "convplane_replay_worker_engine_unfit",
            "1 while a worker's engine fails the replay self-check (no replay on it)",
            labels=["worker", "engine", "reason"],
        )
        for worker in service.workers:
            for problem in worker.engine_problems or ():
                unfit.add_metric([worker.worker_id, worker.engine_id, problem.code], 1.0)
        yield live
        yield spare
        yield unknown
        yield unfit

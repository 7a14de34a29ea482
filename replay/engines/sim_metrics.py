"""The simulated engine's ``/metrics``: Prometheus text shaped like a real vLLM server's.

Built with ``prometheus_client`` (as vLLM builds its own), so the exposition has what a real one
has and a parser must cope with: ``# HELP``/``# TYPE`` lines naming counter families without
``_total``, ``_total`` and ``_created`` samples per counter, the ``model_name`` and ``engine``
labels on every series, ``vllm:prompt_tokens_by_source_total`` by ``source``,
``vllm:kv_cache_usage_perc``, and the ``vllm:time_to_first_token_seconds`` histogram with
vLLM's buckets. Names and types follow vLLM V1's ``PrometheusStatLogger``. A simulator: the
values come from ``sim_core``, not from a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from replay.drill_tally import ttft_buckets
from replay.engines.sim_core import PrefillServerModel


class _SimCollector(Collector):
    def __init__(self, core: PrefillServerModel, model_name: str, created_s: float) -> None:
        self._core = core
        self._model_name = model_name
        self._created_s = created_s

    def collect(self) -> Iterator[Metric]:
        core, c = self._core, self._core.counters
        metrics = core.metrics()
        labels = ["model_name", "engine"]
        values = [self._model_name, "0"]

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value, created=self._created_s)
            return family

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            metrics.num_requests_running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            metrics.num_requests_waiting,
        )
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            metrics.kv_cache_usage_perc or 0.0,
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_cache_queries_total,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_cache_hits_total,
        )
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens_total
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*labels, "source"],
        )
        for source, value in (
            ("local_compute", c.computed_prompt_tokens_total),
            ("local_cache_hit", c.cached_prompt_tokens_total),
            ("external_kv_transfer", 0),
        ):
            by_source.add_metric([*values, source], value, created=self._created_s)
        yield by_source
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", c.requests_total
        )
        buckets = [
            ("+Inf" if math.isinf(bound_s) else repr(bound_s), count)
            for bound_s, count in ttft_buckets(c.ttft_bucket_counts, c.requests_total)
        ]
        ttft = HistogramMetricFamily(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels=labels,
        )
        ttft.add_metric(values, buckets, c.ttft_sum_s)
        yield ttft


def render_sim_exposition(core: PrefillServerModel, model_name: str, created_s: float) -> str:
    """The exposition text (``created_s``: wall-clock start of the simulated server)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(core, model_name, created_s))
    return generate_latest(registry).decode()

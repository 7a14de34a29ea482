"""Read vLLM's ``/metrics`` (Prometheus text exposition format) into ``EngineMetrics``.

Uses ``prometheus_client.parser``. A value is the sum over the label sets of its sample (vLLM
labels every series with ``model_name`` and ``engine``, one per data-parallel engine); a
counter's ``_created`` sample is a different sample name and is never added in. The
``prompt_tokens_by_source_total`` value is the ``source="local_compute"`` series only.

**Absent is not zero.** The four series replay cannot judge spare capacity without
(``REQUIRED``) make the scrape fail with ``EngineMetricsMissing``: the engine is "unknown" and
gets no replay (``--disable-log-stats``, a renamed series). Reading them as 0 would read live
load as 0 and hand replay the whole engine. Optional series are None when absent. The TTFT histogram
(``vllm:time_to_first_token_seconds``) is kept as its cumulative buckets, summed per ``le``.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from replay.engines.base import EngineUnavailable
from replay.model import EngineMetrics

#: EngineMetrics field -> (sample name in vLLM's exposition, required label values or None)
VLLM_SAMPLES: dict[str, tuple[str, dict[str, str] | None]] = {
    "prompt_tokens_total": ("vllm:prompt_tokens_total", None),
    "generation_tokens_total": ("vllm:generation_tokens_total", None),
    "num_requests_running": ("vllm:num_requests_running", None),
    "num_requests_waiting": ("vllm:num_requests_waiting", None),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", None),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", None),
    "computed_prompt_tokens_total": (
        "vllm:prompt_tokens_by_source_total",
        {"source": "local_compute"},
    ),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", None),
}
TTFT_BUCKET_SAMPLE = "vllm:time_to_first_token_seconds_bucket"
REQUIRED = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "num_requests_running",
    "num_requests_waiting",
)


class EngineMetricsMissing(EngineUnavailable):
    """The engine's ``/metrics`` lacks a series replay needs: capacity unknown, no replay."""

    code = "engine_metrics_missing"


def parse_engine_metrics(text: str) -> EngineMetrics:
    by_name: dict[str, list[tuple[str, dict[str, str] | None]]] = {}
    for field, (name, labels) in VLLM_SAMPLES.items():
        by_name.setdefault(name, []).append((field, labels))
    found: dict[str, float] = {}
    ttft: dict[float, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == TTFT_BUCKET_SAMPLE and "le" in sample.labels:
                    bound_s = float(sample.labels["le"])
                    ttft[bound_s] = ttft.get(bound_s, 0.0) + float(sample.value)
                for field, labels in by_name.get(sample.name, ()):
                    if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                        continue
                    found[field] = found.get(field, 0.0) + float(sample.value)
    except ValueError as exc:
        raise EngineUnavailable(f"engine /metrics is not Prometheus text: {exc}") from exc
    missing = [VLLM_SAMPLES[f][0] for f in REQUIRED if f not in found]
    if missing:
        raise EngineMetricsMissing(
            f"engine /metrics lacks {', '.join(missing)} (started with --disable-log-stats, "
            "or a vLLM that renamed them): live load unknown, no replay"
        )
    return EngineMetrics(
        prompt_tokens_total=found["prompt_tokens_total"],
        generation_tokens_total=found["generation_tokens_total"],
        num_requests_running=found["num_requests_running"],
        num_requests_waiting=found["num_requests_waiting"],
        prefix_cache_queries_total=found.get("prefix_cache_queries_total"),
        prefix_cache_hits_total=found.get("prefix_cache_hits_total"),
        computed_prompt_tokens_total=found.get("computed_prompt_tokens_total"),
        kv_cache_usage_perc=found.get("kv_cache_usage_perc"),
        ttft_buckets=tuple(sorted(ttft.items())) if math.inf in ttft else None,
    )

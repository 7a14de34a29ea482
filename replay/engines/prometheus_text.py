"""Read vLLM's ``/metrics`` (Prometheus text exposition format) into ``EngineMetrics``.

Uses ``prometheus_client.parser``. Each value is the sum over all label sets of the sample
(vLLM labels by ``model_name`` and, with data parallelism, ``engine``). A missing metric reads as
0 (for example, the prefix-cache counters are absent when prefix caching is disabled).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from replay.engines.base import EngineUnavailable
from replay.model import EngineMetrics

#: EngineMetrics field -> sample name in vLLM's exposition
VLLM_SAMPLE_NAMES: dict[str, str] = {
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
}


def parse_engine_metrics(text: str) -> EngineMetrics:
    wanted = {name: 0.0 for name in VLLM_SAMPLE_NAMES.values()}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    wanted[sample.name] += float(sample.value)
    except ValueError as exc:
        raise EngineUnavailable(f"engine /metrics is not Prometheus text: {exc}") from exc
    return EngineMetrics(**{field: wanted[name] for field, name in VLLM_SAMPLE_NAMES.items()})


def render_engine_metrics(metrics: EngineMetrics, model_name: str) -> str:
    """The simulator's exposition, shaped like vLLM's (same names, a ``model_name`` label)."""
    label = '{model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    lines: list[str] = []
    for field, name in VLLM_SAMPLE_NAMES.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        family = name.removesuffix("_total")
        lines.append(f"# HELP {family} {field} (simulated engine)")
        lines.append(f"# TYPE {family} {kind}")
        lines.append(f"{name}{label} {getattr(metrics, field)!r}")
    return "\n".join(lines) + "\n"

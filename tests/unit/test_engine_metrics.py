"""Reading vLLM's /metrics and the spare arithmetic on counter sequences shaped like vLLM's.

``VLLM_EXPOSITION`` is written the way a vLLM V1 server with two data-parallel engines exposes
its metrics (prometheus_client's text format: HELP/TYPE lines, ``_total`` and ``_created``
samples per counter, ``model_name`` and ``engine`` labels, prompt tokens by ``source``), with
the names and types of vLLM's ``PrometheusStatLogger``.
"""

from __future__ import annotations

import math
import random

import pytest

from replay.capacity import CapacityConfig, CapacityController, CapacityPoller, SpareEstimator
from replay.engines.base import EngineUnavailable, InferenceEngine
from replay.engines.prometheus_text import EngineMetricsMissing, parse_engine_metrics
from replay.engines.sim_core import PrefillServerModel, SimEngineConfig
from replay.engines.sim_metrics import render_sim_exposition
from replay.model import EngineMetrics, PrefillOutcome, PrefillRequest
from tests.unit.clocks import ManualClock

M = 'model_name="llama@r1"'
VLLM_EXPOSITION = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{M}}} 3.0
vllm:num_requests_running{{engine="1",{M}}} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{M}}} 2.0
vllm:num_requests_waiting{{engine="1",{M}}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{M}}} 0.25
vllm:kv_cache_usage_perc{{engine="1",{M}}} 0.5
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",{M}}} 12000.0
vllm:prefix_cache_queries_total{{engine="1",{M}}} 3000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",{M}}} 1.7646e+09
vllm:prefix_cache_queries_created{{engine="1",{M}}} 1.7646e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",{M}}} 4000.0
vllm:prefix_cache_hits_total{{engine="1",{M}}} 1000.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",{M}}} 10000.0
vllm:prompt_tokens_total{{engine="1",{M}}} 2500.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{engine="0",{M}}} 1.7646e+09
vllm:prompt_tokens_created{{engine="1",{M}}} 1.7646e+09
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{{engine="0",{M},source="local_compute"}} 7000.0
vllm:prompt_tokens_by_source_total{{engine="0",{M},source="local_cache_hit"}} 3000.0
vllm:prompt_tokens_by_source_total{{engine="0",{M},source="external_kv_transfer"}} 0.0
vllm:prompt_tokens_by_source_total{{engine="1",{M},source="local_compute"}} 1500.0
vllm:prompt_tokens_by_source_total{{engine="1",{M},source="local_cache_hit"}} 1000.0
vllm:prompt_tokens_by_source_total{{engine="1",{M},source="external_kv_transfer"}} 0.0
# HELP vllm:prompt_tokens_by_source_created Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_created gauge
vllm:prompt_tokens_by_source_created{{engine="0",{M},source="local_compute"}} 1.7646e+09
vllm:prompt_tokens_by_source_created{{engine="1",{M},source="local_compute"}} 1.7646e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",{M}}} 800.0
vllm:generation_tokens_total{{engine="1",{M}}} 200.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{{engine="0",{M}}} 1.7646e+09
vllm:generation_tokens_created{{engine="1",{M}}} 1.7646e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",{M}}} 4.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{M}}} 5.0
vllm:time_to_first_token_seconds_count{{engine="0",{M}}} 5.0
vllm:time_to_first_token_seconds_sum{{engine="0",{M}}} 0.9
"""


def test_a_vllm_exposition_reads_summed_over_engines_without_created_series() -> None:
    m = parse_engine_metrics(VLLM_EXPOSITION)
    assert m == EngineMetrics(
        prompt_tokens_total=12500.0,
        generation_tokens_total=1000.0,
        num_requests_running=4.0,
        num_requests_waiting=2.0,
        prefix_cache_queries_total=15000.0,
        prefix_cache_hits_total=5000.0,
        computed_prompt_tokens_total=8500.0,  # local_compute only
        kv_cache_usage_perc=0.75,
        ttft_buckets=((0.1, 4.0), (math.inf, 5.0)),  # cumulative, +Inf last
    )


@pytest.mark.parametrize(
    "series",
    ["vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_requests_running",
     "vllm:num_requests_waiting"],
)  # fmt: skip
def test_an_absent_required_series_makes_the_engine_unknown(series: str) -> None:
    text = "\n".join(line for line in VLLM_EXPOSITION.splitlines() if series not in line)
    with pytest.raises(EngineMetricsMissing, match=series):
        parse_engine_metrics(text + "\n")


def test_optional_series_read_none_when_absent_not_zero() -> None:
    kept = [
        line
        for line in VLLM_EXPOSITION.splitlines()
        if "prefix_cache" not in line and "by_source" not in line
    ]
    m = parse_engine_metrics("\n".join(kept) + "\n")
    assert m.prefix_cache_hits_total is None and m.computed_prompt_tokens_total is None
    assert m.prompt_tokens_total == 12500.0


def test_the_simulator_exposes_what_the_parser_reads() -> None:
    core = PrefillServerModel(SimEngineConfig(prefill_tokens_per_s=1000.0))
    core.submit(list(range(700)), "s", 0, 0.0)
    core.advance(10.0)
    text = render_sim_exposition(core, "sim@1", 1.7e9)
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert 'vllm:prompt_tokens_created{engine="0",model_name="sim@1"}' in text
    assert (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="sim@1"} 1.0'
        in text
    )
    assert parse_engine_metrics(text) == core.metrics()


def snapshot(
    prompt: float, hits: float, computed: float | None, waiting: float = 0
) -> EngineMetrics:
    return EngineMetrics(prompt, prompt / 100, 1.0, waiting, prompt + 1000, hits, computed)


# A long prompt (8,192 tokens, 2,048 of them cached) prefilled in 512-token chunks at
# 4,096 computed tokens/s: its hits are counted when it is scheduled (scrape 1), its prompt
# tokens only when its prefill completes (scrape 4), by which time a short live request has
# completed too. computed = the local_compute series.
CHUNKED = [  # (prompt_tokens_total, prefix_cache_hits_total, local_compute)
    (100_000.0, 20_000.0, 80_000.0),
    (100_000.0, 22_048.0, 80_000.0),  # scheduled: hits jump, prompt tokens not yet
    (100_500.0, 22_048.0, 80_500.0),  # a 500-token live request completed
    (100_500.0, 22_048.0, 80_500.0),
    (108_692.0, 22_048.0, 86_644.0),  # the long prompt completed: 8,192 prompt, 6,144 computed
]


def feed(
    estimator: SpareEstimator, rows: list[tuple[float, float, float]], with_source: bool
) -> None:
    for i, (prompt, hits, computed) in enumerate(rows):
        estimator.observe(snapshot(prompt, hits, computed if with_source else None), i * 1.0, 0)


@pytest.mark.parametrize("with_source", [True, False])
def test_hits_running_ahead_of_prompt_tokens_is_not_a_restart(with_source: bool) -> None:
    estimator = SpareEstimator(CapacityConfig(10_000.0, spare_window_s=10.0, rise_window_s=2.0))
    feed(estimator, CHUNKED, with_source)
    assert estimator.restarts_total == 0
    # all live work of the window counted once: 500 + 6,144 computed tokens over 4 s
    assert estimator.live_tokens_per_s == pytest.approx((500 + 6144) / 4.0)


def test_the_old_difference_would_have_read_a_restart() -> None:
    """Why the fix: prompt - hits goes down between scrapes 0 and 1."""
    diffs = [prompt - hits for prompt, hits, _ in CHUNKED]
    assert diffs[1] < diffs[0]


def test_any_counter_going_down_is_a_restart_that_clears_the_window() -> None:
    estimator = SpareEstimator(CapacityConfig(10_000.0))
    estimator.observe(snapshot(50_000.0, 10_000.0, 40_000.0), 0.0, 0)
    estimator.note_replay_computed(3000.0)
    estimator.observe(snapshot(60_000.0, 10_000.0, 50_000.0), 1.0, 0)
    assert estimator.live_tokens_per_s == pytest.approx(7000.0)
    estimator.note_replay_computed(2000.0)
    restarted = EngineMetrics(900.0, 5.0, 0.0, 0.0, 1000.0, 100.0, 800.0)  # fresh process
    estimator.observe(restarted, 2.0, 0)
    assert estimator.restarts_total == 1
    estimator.observe(EngineMetrics(1900.0, 10.0, 0.0, 0.0, 2000.0, 100.0, 1800.0), 3.0, 0)
    # the replay accounting from before the restart is gone; only the new 1,000 are live
    assert estimator.live_tokens_per_s == pytest.approx(1000.0)


def test_only_replays_at_the_engine_are_taken_off_its_waiting_count() -> None:
    estimator = SpareEstimator(CapacityConfig(10_000.0))
    estimator.observe(snapshot(1000.0, 0.0, 1000.0, waiting=3.0), 0.0, replays_at_engine=2)
    assert estimator.live_waiting == 1.0  # two of the three can be replay's own
    # a region's grants include jobs still on the bus: they are in no engine's queue
    estimator.observe(snapshot(1000.0, 0.0, 1000.0, waiting=3.0), 1.0, replays_at_engine=0)
    assert estimator.live_waiting == 3.0


class MetricsOnlyEngine(InferenceEngine):
    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def engine_id(self) -> str:
        return "e0"

    @property
    def model_revision(self) -> str:
        return "llama@r1"

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        raise EngineUnavailable("not used")

    async def metrics(self) -> EngineMetrics:
        return parse_engine_metrics(self.text)

    async def aclose(self) -> None:
        return None


async def test_an_engine_without_its_stats_gets_no_replay_and_says_why() -> None:
    clock = ManualClock()
    disabled = "\n".join(
        line for line in VLLM_EXPOSITION.splitlines() if "prompt_tokens" not in line
    )  # what --disable-log-stats leaves: no token counters
    engine = MetricsOnlyEngine(disabled + "\n")
    controller = CapacityController(CapacityConfig(10_000.0), clock)
    poller = CapacityPoller(engine, controller, clock, random.Random(1))
    assert not await poller.poll_once()
    assert poller.unknown_reason is not None and "vllm:prompt_tokens_total" in poller.unknown_reason
    assert controller.snapshot().spare_tokens_per_s == 0.0
    engine.text = VLLM_EXPOSITION
    assert await poller.poll_once()
    assert poller.unknown_reason is None

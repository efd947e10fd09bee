"""Engine load from Prometheus text, by the per-engine name table."""

from __future__ import annotations

from router.backends.engines import parse_load, parse_samples

VLLM = """# HELP vllm:num_requests_running Requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 2.0
vllm:num_requests_waiting{model_name="a"} 7
vllm:num_requests_waiting_total 99
vllm:kv_cache_usage_perc{model_name="a",engine="0"} 0.25
vllm:prompt_tokens_total{model_name="a"} 1e3
"""


def test_vllm_names_summed_over_label_sets() -> None:
    load = parse_load(VLLM, "vllm")
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, 7.0, 0.25)


def test_sglang_names_and_missing_series() -> None:
    text = 'sglang:num_queue_reqs 4\nsglang:num_running_reqs{tp_rank="0"} 1\n'
    load = parse_load(text, "sglang")
    assert (load.waiting, load.running, load.kv_cache_usage) == (4.0, 1.0, None)


def test_garbage_lines_are_skipped() -> None:
    text = "\n".join(
        [
            "vllm:num_requests_running",
            'vllm:num_requests_running{a="b"} x',
            "vllm:num_requests_running 2",
        ]
    )
    assert parse_samples(text, frozenset({"vllm:num_requests_running"})) == {
        "vllm:num_requests_running": 2.0
    }

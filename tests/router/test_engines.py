"""Engine load from Prometheus text, by the per-engine name table."""

from __future__ import annotations

from router.backends.engines import detect_engine, parse_load, parse_samples
from router.backends.health import _models

VLLM = """# HELP vllm:num_requests_running Requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 2.0
vllm:num_requests_waiting{model_name="a"} 7
vllm:num_requests_waiting_total 99
vllm:kv_cache_usage_perc{model_name="a",engine="0"} 0.25
vllm:prompt_tokens_total{model_name="a"} 1e3
"""

# Captured from llama-server (llama-cpp-python 0.3.36's vendored llama.cpp, --parallel 4
# --metrics) with four streams decoding and a fifth queued; the other series cut for length.
LLAMACPP = "".join(
    line + "\n"
    for line in (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed,"
        " excluding cached tokens",
        "# TYPE llamacpp:prompt_tokens_total counter",
        "llamacpp:prompt_tokens_total 0",
        "# HELP llamacpp:requests_processing Number of requests processing",
        "# TYPE llamacpp:requests_processing gauge",
        "llamacpp:requests_processing 4",
        "# HELP llamacpp:requests_deferred Number of requests deferred",
        "# TYPE llamacpp:requests_deferred gauge",
        "llamacpp:requests_deferred 1",
        "# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per"
        " llama_decode() call",
        "# TYPE llamacpp:n_busy_slots_per_decode gauge",
        "llamacpp:n_busy_slots_per_decode 0",
    )
)

# The same server's GET /v1/models (its Ollama-style "models" list cut): no max_model_len.
LLAMACPP_MODELS = (
    b'{"object":"list","data":[{"id":"smollm2-135m","aliases":["smollm2-135m"],"tags":[],'
    b'"object":"model","created":1796139511,"owned_by":"llamacpp","meta":{"vocab_type":2,'
    b'"n_vocab":49152,"n_ctx":2048,"n_ctx_train":8192,"n_embd":576,"n_params":134515008,'
    b'"size":96576768,"ftype":"Q4_1"}}]}'
)


def test_vllm_names_summed_over_label_sets() -> None:
    load = parse_load(VLLM, "vllm")
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, 7.0, 0.25)


def test_vllm_kv_capacity_from_cache_config_info() -> None:
    # vLLM's info gauge: the cache config in labels, one sample per data-parallel engine.
    text = VLLM + "".join(
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="{i}",'
        f'num_gpu_blocks="{blocks}",enable_prefix_caching="True"}} 1.0\n'
        for i, blocks in enumerate((1000, 1500))
    )
    assert parse_load(text, "vllm").kv_cache_tokens == 16 * 2500
    assert parse_load(text, "some-vllm-fork").kv_cache_tokens == 16 * 2500
    assert parse_load(VLLM, "vllm").kv_cache_tokens is None
    # one without the block count says nothing
    assert parse_load('vllm:cache_config_info{block_size="16"} 1\n', "vllm").kv_cache_tokens is None


def test_sglang_names_and_missing_series() -> None:
    text = 'sglang:num_queue_reqs 4\nsglang:num_running_reqs{tp_rank="0"} 1\n'
    load = parse_load(text, "sglang")
    assert (load.waiting, load.running, load.kv_cache_usage) == (4.0, 1.0, None)
    sized = parse_load(text + "sglang:max_total_num_tokens 500000\n", "sglang")
    assert sized.kv_cache_tokens == 500000.0


def test_llamacpp_busy_slots_and_deferred_requests() -> None:
    load = parse_load(LLAMACPP, "llamacpp")
    # this build exports no KV-cache gauge
    assert (load.running, load.waiting, load.kv_cache_usage) == (4.0, 1.0, None)
    # older builds' kv_cache_usage_ratio is read when present
    older = parse_load(LLAMACPP + "llamacpp:kv_cache_usage_ratio 0.5\n", "llamacpp")
    assert older.kv_cache_usage == 0.5


def test_llamacpp_context_length_from_its_models_meta() -> None:
    # llama.cpp's per-slot n_ctx stands in for vLLM's max_model_len
    assert _models(LLAMACPP_MODELS) == (("smollm2-135m",), 2048)
    vllm = b'{"data":[{"id":"m","max_model_len":4096,"meta":{"n_ctx":2048}}]}'
    assert _models(vllm) == (("m",), 4096)


def test_unknown_kind_is_read_by_the_names_it_exposes() -> None:
    assert parse_load(VLLM, "my-vllm-fork") == parse_load(VLLM, "vllm")
    assert parse_load(LLAMACPP, "llama") == parse_load(LLAMACPP, "llamacpp")
    text = 'sglang:num_queue_reqs 4\nsglang:num_running_reqs{tp_rank="0"} 1\n'
    assert parse_load(text, "sglang-nightly") == parse_load(text, "sglang")
    # a known kind reads only its own row, whatever else the text holds
    assert parse_load(VLLM, "sglang") == parse_load("", "sglang")
    assert detect_engine({"tgi_queue_size": 0.0}) == "tgi"
    assert detect_engine({"something_else": 1.0}) is None


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

"""A prefill and a decode emulator over loopback, driven as vLLM's P/D proxy drives them."""

from __future__ import annotations

import openai
import pytest

from router.proxy.pd import TO_DECODE
from tests.emulator.conftest import client_for
from tests.procs import metric, start_emulator

MODEL = "deepseek-v4.1-flash"
PROMPT = " ".join(f"w{i}" for i in range(400))


def prefill(client: openai.OpenAI) -> dict[str, object]:
    resp = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"kv_transfer_params": TO_DECODE}
    )
    assert resp.usage is not None and resp.usage.completion_tokens == 1
    params = (resp.model_extra or {}).get("kv_transfer_params")
    assert isinstance(params, dict)
    return params


def test_decode_pulls_what_prefill_holds_and_streams() -> None:
    with (
        start_emulator("vllm", time_scale=50, args=["--set", "role=prefill"]) as p,
        start_emulator("vllm", time_scale=50, args=["--set", "role=decode"]) as d,
    ):
        params = prefill(client_for(p))
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_port"] == int(p.url.rsplit(":", 1)[1])
        assert params["remote_block_ids"] == list(range(400 // 16))
        assert metric(p.url, "vllm:kv_cache_usage_perc") > 0  # held for the decode engine
        stream = client_for(d).completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"kv_transfer_params": params, "ignore_eos": True},
        )
        chunks = list(stream)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 20 and usage.prompt_tokens == 400
        assert metric(d.url, "vllm:nixl_xfer_time_seconds_count") == 1
        assert metric(d.url, "vllm:nixl_bytes_transferred_sum") == 399 * 70272
        assert metric(d.url, "vllm:nixl_num_failed_transfers_total") == 0
        assert metric(p.url, "vllm:kv_cache_usage_perc") == 0  # pulled, so freed
        # a second pull of the same blocks finds none: the decode engine prefills itself
        again = client_for(d).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=5, extra_body={"kv_transfer_params": params}
        )
        assert again.usage is not None and again.usage.completion_tokens >= 1
        assert metric(d.url, "vllm:nixl_num_failed_transfers_total") == 1


@pytest.mark.parametrize("role", ["decode", "both"])
def test_expired_blocks_fall_back_to_a_local_prefill(role: str) -> None:
    hold = ["--set", "role=prefill", "--set", "kv_hold_timeout_s=0"]
    with (
        start_emulator("vllm", time_scale=50, args=hold) as p,
        start_emulator("vllm", time_scale=50, args=["--set", f"role={role}"]) as d,
    ):
        params = prefill(client_for(p))
        resp = client_for(d).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
            extra_body={"kv_transfer_params": params, "ignore_eos": True},
        )
        assert resp.usage is not None and resp.usage.completion_tokens == 8
        assert metric(d.url, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(d.url, "vllm:nixl_xfer_time_seconds_count") == 0
        assert metric(p.url, "vllm:nixl_num_kv_expired_reqs_total") == 1


def test_a_decode_role_ignores_do_remote_decode_and_bad_params_are_400() -> None:
    with start_emulator("vllm", time_scale=50, args=["--set", "role=decode"]) as d:
        resp = client_for(d).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"kv_transfer_params": TO_DECODE}
        )
        assert "kv_transfer_params" not in (resp.model_extra or {})
        assert metric(d.url, "vllm:kv_cache_usage_perc") == 0
        with pytest.raises(openai.BadRequestError, match="kv_transfer_params"):
            client_for(d).completions.create(
                model=MODEL, prompt=PROMPT, extra_body={"kv_transfer_params": [1]}
            )

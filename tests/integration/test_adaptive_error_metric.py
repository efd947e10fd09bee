"""The adaptive policy publishes its own TTFT prediction error, through a real router."""

from __future__ import annotations

import math
import re
from pathlib import Path

from openai.types.chat import ChatCompletionMessageParam

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
SERIES = 'turnout_policy_ttft_prediction_error_ratio{backend="%s",policy="adaptive"}'
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something. " * 50}]


def value(text: str, backend: str) -> float:
    m = re.search(re.escape(SERIES % backend) + r" (\S+)", text)
    assert m, f"no error series for {backend}"
    return float(m.group(1))


def test_prediction_error_per_backend(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=20) as vllm, start_emulator("deepinfer") as other:
        doc = base_config([("v", "vllm", vllm.url), ("d", "deepinfer", other.url)])
        doc["policies"] = {
            "adaptive": {
                "type": "adaptive",
                # a prior 100x too fast: the first predictions are far off, the error shows it
                "params": {
                    "low_ttft": ["vllm"],
                    "high_throughput": ["deepinfer"],
                    "prefill_rate_prior": 1e7,
                },
            }
        }
        doc["default_policy"] = "adaptive"
        with start_router(write_config(tmp_path, doc)) as router:
            before = get(router.url + "/metrics").text
            assert math.isnan(value(before, "v"))  # nothing predicted yet
            client = client_for(router.url)
            errors = []
            for _ in range(4):
                stream = client.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=4, stream=True
                )
                assert list(stream)
                text = get(router.url + "/metrics").text
                errors.append(value(text, "v"))  # every request goes to v
                assert math.isnan(value(text, "d"))
            # The first prediction came from the prior alone, far off; the predictor then
            # learns from what it measured, so the error averaged with later ones comes down.
            assert errors[0] > 0.5
            assert errors[-1] < errors[0]

"""What the router tells ``replay``: SLOs per policy, prices per backend, attempts per answer.

In-process against fake engines (tests/router/fake_upstream.py), over real loopback sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.router.fake_upstream import MODEL, FakeEngine, in_process_router
from tests.router.harness import base_config

SLO = {"interactive": {"ttft_s": 0.5, "tpot_s": 0.05}, "batch": {"ttft_s": 60.0, "tpot_s": 1.0}}


def _config() -> dict[str, Any]:
    doc = base_config([("a", "vllm", "fake"), ("b", "deepinfer", "fake:b")])
    doc["health"]["scrape_metrics"] = False
    doc["policies"]["adaptive"] = {
        "type": "adaptive",
        "params": {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"], "slo": SLO},
    }
    doc["pricing"] = {"a": {"usd_per_hour": 98.5}}
    return doc


async def test_policies_carry_their_slo_and_backends_their_price(tmp_path: Path) -> None:
    async with (
        in_process_router(tmp_path, _config(), others={"b": FakeEngine()}) as ip,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(ip.url + "/turnout/policies") as r:
            policies = {p["name"]: p for p in await r.json()}
        # every policy is judged by the declaring one's targets (router/control/slo.py)
        assert policies["adaptive"]["slo"] == SLO
        assert policies["class-split"]["slo"] == SLO
        async with s.get(ip.url + "/turnout/backends") as r:
            prices = {b["name"]: b["usd_per_hour"] for b in await r.json()}
        assert prices == {"a": 98.5, "b": None}


async def test_answers_say_how_many_backends_were_tried(tmp_path: Path) -> None:
    dead = FakeEngine()
    dead.error_status = 503  # a gateway status before the first byte: the router fails over
    doc = base_config([("dead", "vllm", "fake"), ("good", "vllm", "fake:good")])
    doc["health"]["scrape_metrics"] = False
    doc["policies"]["dead-first"] = {"type": "pinned", "params": {"backend": "dead"}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        in_process_router(tmp_path, doc, dead, others={"good": FakeEngine()}) as ip,
        aiohttp.ClientSession() as s,
    ):
        headers = {"X-Turnout-Policy": "good-only"}
        async with s.post(ip.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200 and r.headers["X-Turnout-Attempts"] == "1"
        headers = {"X-Turnout-Policy": "round-robin"}
        tried = set()
        for _ in range(4):
            async with s.post(ip.url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200 and r.headers["X-Turnout-Backend"] == "good"
                tried.add(r.headers["X-Turnout-Attempts"])
        assert tried == {"1", "2"}  # round-robin began at the dead one every other time


def test_a_price_names_a_configured_backend() -> None:
    doc = base_config([("vllm", "vllm", "http://127.0.0.1:1")])
    doc["pricing"] = {"vlm": {"usd_per_hour": 3}, "vllm": {"usd": 3}}
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    message = str(exc.value)
    assert "pricing.vlm: unknown backend 'vlm' (did you mean 'vllm'?)" in message
    assert "pricing.vllm.usd_per_hour: is required" in message
    assert "pricing.vllm.usd: unknown key 'usd'" in message
    doc["pricing"] = {"vllm": {"usd_per_hour": -1}}
    with pytest.raises(ConfigError, match=r"pricing\.vllm\.usd_per_hour"):
        parse_config(doc)
    doc["pricing"] = {"vllm": {"usd_per_hour": 40}}
    assert parse_config(doc).pricing == {"vllm": 40.0}

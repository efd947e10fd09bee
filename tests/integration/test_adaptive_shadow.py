"""Shadow mirroring through a real router: the client never waits for the shadow."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.procs import Process, metric, metric_in, start_emulator, wait_for
from tests.router.harness import base_config, client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something short."}]
STALL_S = 30.0


@pytest.fixture(scope="module")
def live() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=20) as emu:
        yield emu


def config(live: Process, shadow: Process, **mirror: object) -> dict[str, object]:
    doc = base_config([("live", "vllm", live.url), ("shadow", "deepinfer", shadow.url)])
    doc["policies"] = {
        "plain": {"type": "pinned", "params": {"backend": "live"}},
        "mirrored": {"type": "pinned", "params": {"backend": "live"}},
    }
    doc["default_policy"] = "plain"
    doc["shadow"] = {"mirrored": {"backend": "shadow", **mirror}}
    return doc


def test_stalled_shadow_does_not_delay_the_client(live: Process, tmp_path: Path) -> None:
    """Every request is mirrored to a backend that answers nothing for 30 s; the client's
    requests still complete one after another, each long before the stall could end, and the
    shadow's bound drops the excess."""
    with start_emulator("deepinfer", time_scale=20, args=["--stall", str(STALL_S)]) as stalled:
        doc = config(live, stalled, sample=1.0, max_concurrency=2)
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url, **{"X-Turnout-Policy": "mirrored"})
            started = time.monotonic()
            for _ in range(6):
                t0 = time.monotonic()
                stream = client.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=8, stream=True
                )
                chunks = list(stream)
                assert chunks
                # The shadow answers nothing before STALL_S: had the client waited on it,
                # this request could not have finished yet.
                assert time.monotonic() - t0 < STALL_S / 2
            assert time.monotonic() - started < STALL_S / 2
            text = get(router.url + "/metrics").text
            # Two shadow requests are still waiting on the stalled backend; four were dropped.
            assert metric_in(text, r'turnout_shadow_dropped_total\{policy="mirrored"\}') == 4
            assert "turnout_shadow_requests_total{" not in text
            served = r'turnout_requests_total\{backend="live",class="interactive",code="200"'
            assert metric_in(text, served + r',policy="mirrored",reason="ok"\}') == 6
            assert 'turnout_requests_total{backend="shadow"' not in text
            # Open shadow requests do not count as the backend's in-flight work.
            assert metric_in(text, r'turnout_inflight_requests\{backend="shadow"\}') == 0


def test_class_filter_and_shadow_metrics(live: Process, tmp_path: Path) -> None:
    with start_emulator("deepinfer", time_scale=20) as shadow:
        doc = config(live, shadow, sample=1.0, **{"class": "batch"})
        with start_router(write_config(tmp_path, doc)) as router:
            batch = client_for(router.url, **{"X-Turnout-Policy": "mirrored"})
            for cls in ("batch", "interactive", "batch"):
                batch.chat.completions.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=4,
                    extra_headers={"X-Request-Class": cls},
                )
            pattern = (
                r'turnout_shadow_requests_total\{backend="shadow",class="batch",'
                r'code="200",policy="mirrored"\}'
            )
            assert wait_for(lambda: metric(router.url, pattern) == 2)
            text = get(router.url + "/metrics").text
            assert 'turnout_shadow_requests_total{backend="shadow",class="interactive"' not in text
            e2e = r'turnout_shadow_e2e_request_latency_seconds_count\{backend="shadow",'
            assert metric_in(text, e2e + r'class="batch",policy="mirrored"\}') == 2
            # Unmirrored policy: nothing sampled.
            plain = client_for(router.url)
            plain.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=4, extra_headers={"X-Request-Class": "batch"}
            )
            time.sleep(0.3)
            assert metric(router.url, pattern) == 2


def test_shadow_config_errors() -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:9"), ("b", "vllm", "http://127.0.0.1:9")])
    doc["shadow"] = {
        "nope": {"backend": "b"},
        "class-split": {"backend": "b", "policy": "round-robin"},
        "round-robin": {"backend": "zz", "sample": 2, "max_concurrency": 0, "extra": 1},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    paths = {p for p, _ in info.value.errors}
    assert paths == {
        "shadow.nope",
        "shadow.class-split",
        "shadow.round-robin.backend",
        "shadow.round-robin.sample",
        "shadow.round-robin.max_concurrency",
        "shadow.round-robin.extra",
    }

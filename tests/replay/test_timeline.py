"""A run on the trace's clock: windows, rates, in-flight time, SLO share, slowest requests."""

from __future__ import annotations

import pytest

from replay.client import Result
from replay.timeline import MAX_WINDOWS, SLOWEST, Frame, Timeline, window_seconds


def _ok(cid: str, ttft: float, e2e: float, tokens: int = 11, **kw: object) -> Result:
    base: dict[str, object] = {
        "custom_id": cid,
        "request_class": "interactive",
        "status": 200,
        "stream": True,
        "lag": 0.0,
        "backend": "vllm",
        "ttft": ttft,
        "e2e": e2e,
        "itls": [(e2e - ttft) / (tokens - 1)] * (tokens - 1),
        "prompt_tokens": 100,
        "completion_tokens": tokens,
    }
    base.update(kw)
    return Result(**base)  # type: ignore[arg-type]


def test_windows_fit_the_trace_s_length() -> None:
    assert window_seconds(50.0) == 1.0
    assert window_seconds(240.0) == 5.0  # the bundled capture: 48 windows
    assert window_seconds(3600.0) == 60.0
    assert window_seconds(86400.0) == 1800.0
    assert window_seconds(10 * 86400.0) == 21600.0
    assert window_seconds(600.0, 2.5) == 2.5
    assert window_seconds(86400.0, 1.0) == 86400.0 / MAX_WINDOWS  # never more windows


def test_figures_per_window_on_the_trace_s_clock() -> None:
    # replayed at speed 2: 10 s windows of the trace are 5 s of the replay
    t = Timeline(Frame(10.0, speed=2.0, slo={"interactive": (0.5, 0.1)}))
    t.add(_ok("a", 0.2, 1.2), sent=1.0)  # tpot 0.1: met
    t.add(_ok("b", 0.8, 1.8), sent=2.0)  # TTFT over 0.5 s: missed
    t.add(_ok("c", 0.1, 5.5, 101), sent=4.0)  # runs into the second window, ends there
    t.add(Result("d", "interactive", 503, True, 0.0, backend="vllm", e2e=0.05), sent=6.0)
    t.add(_ok("e", 0.3, 0.5, request_class="batch", stream=False), sent=7.0)
    doc = t.to_dict(9.5)
    assert doc["window_s"] == 10.0 and doc["starts_s"] == [0.0, 10.0]
    assert doc["seconds"] == [5.0, 4.5]  # the last answer ends at 9.5 s
    every = doc["groups"]["all"]
    assert every["arrivals"] == [3, 2]
    assert every["rate"] == [0.6, 0.4]  # per second of the replay
    assert every["errors"] == [0, 1]
    # a: 1.2 s, b: 1.8 s, c: 1 s of its 5.5 s in the first window, 4.5 s in the second
    assert every["inflight"][0] == pytest.approx((1.2 + 1.8 + 1.0) / 5.0)
    assert every["inflight"][1] == pytest.approx((4.5 + 0.05 + 0.5) / 5.0)
    assert every["out_tokens"] == [22, 112]  # c's tokens count where it finished
    inter = doc["groups"]["interactive"]
    assert inter["p50_ttft_ms"][0] == pytest.approx(200.0)
    assert inter["p95_ttft_ms"][0] == pytest.approx(740.0)
    assert inter["goodput"] == [pytest.approx(2 / 3), 0.0]  # the failure misses
    assert doc["groups"]["batch"]["goodput"] == [None, None]  # no SLO for the class
    assert doc["groups"]["batch"]["mean_tpot_ms"] == [None, None]  # not streamed
    shares = doc["backends"]["vllm"]["interactive"]
    assert shares["requests"] == [3, 1] and shares["tokens"] == [423, 0]


def test_a_window_past_the_run_s_end_has_no_seconds_in_it() -> None:
    t = Timeline(Frame())
    t.add(_ok("a", 0.1, 0.5), sent=0.0)
    doc = t.to_dict(2.5)
    assert doc["seconds"] == [1.0, 1.0, 0.5]


def test_the_slowest_requests_per_class_with_their_backend_and_cache() -> None:
    t = Timeline(Frame())
    for k in range(SLOWEST + 5):
        r = _ok(f"i{k}", 0.01 * (k + 1), 1.0, backend=f"b{k % 2}", attempts=1 + k % 2)
        r.cached_tokens = 16 * k
        t.add(r, sent=float(k))
    t.add(_ok("slow-batch", 9.0, 9.0, request_class="batch"), sent=0.0)
    t.add(Result("failed", "batch", 500, True, 0.0), sent=0.0)  # no TTFT: not a candidate
    got = t.slowest()
    assert [e["custom_id"] for e in got if e["class"] == "batch"] == ["slow-batch"]
    inter = [e for e in got if e["class"] == "interactive"]
    assert [e["custom_id"] for e in inter] == [f"i{k}" for k in range(SLOWEST + 4, 4, -1)]
    top = inter[0]
    assert top["ttft_ms"] == pytest.approx(150.0) and top["sent_s"] == 14.0
    assert (top["backend"], top["attempts"], top["cached_tokens"]) == ("b0", 1, 224)
    assert top["prompt_tokens"] == 100 and top["output_tokens"] == 11


def test_a_target_naming_endless_backends_is_bounded() -> None:
    t = Timeline(Frame())
    for k in range(100):
        t.add(_ok(f"r{k}", 0.1, 0.2, backend=f"made-up-{k}"), sent=0.0)
    names = t.to_dict(0.2)["backends"]
    assert len(names) == 33 and names["other"]["interactive"]["requests"] == [68]

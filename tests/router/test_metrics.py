"""The metrics facade: names and labels of docs/router.md, a registry of its own."""

from __future__ import annotations

from policies.base import PipelineObserver
from policies.registry import BackendInfo, build_policy
from policies.testing import make_candidate as cand
from policies.testing import make_request, send
from router.observe.decisions import PLUGIN_SAMPLE
from router.observe.metrics import Metrics


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_request_done_records_every_series() -> None:
    m = Metrics()
    lab = {"policy": "p", "backend": "b", "class": "interactive"}
    m.request_done("p", "b", "interactive", 200, "ok", ttft=0.05, tpot=0.01, e2e=1.0,
                   prompt_tokens=10, output_tokens=20)  # fmt: skip
    m.request_done("p", "b", "interactive", 503, "upstream_error", ttft=None, tpot=None,
                   e2e=None, prompt_tokens=None, output_tokens=None)  # fmt: skip
    assert sample(m, "turnout_requests_total", **lab, code="200", reason="ok") == 1
    assert sample(m, "turnout_requests_total", **lab, code="503", reason="upstream_error") == 1
    assert sample(m, "turnout_time_to_first_token_seconds_count", **lab) == 1
    assert sample(m, "turnout_time_to_first_token_seconds_bucket", **lab, le="0.05") == 1
    assert sample(m, "turnout_time_to_first_token_seconds_bucket", **lab, le="0.04") == 0
    assert sample(m, "turnout_e2e_request_latency_seconds_count", **lab) == 1
    assert sample(m, "turnout_prompt_tokens_total", **lab) == 10
    assert sample(m, "turnout_output_tokens_total", **lab) == 20


def test_gauges_read_live_state_and_registries_are_separate() -> None:
    m, other = Metrics(), Metrics()
    value = [3.0]
    m.watch_backend("b", lambda: value[0], lambda: 1.0)
    value[0] = 5.0
    assert sample(m, "turnout_inflight_requests", backend="b") == 5.0
    assert sample(m, "turnout_backend_up", backend="b") == 1.0
    assert sample(other, "turnout_inflight_requests", backend="b") is None
    m.failover("p", "b")
    m.policy.decision("p", 2e-5)
    m.capture.dropped("queue_full")
    m.capture.degraded("unencodable")
    text = m.render().decode()
    assert 'turnout_failovers_total{backend="b",policy="p"} 1.0' in text
    assert 'turnout_policy_decision_seconds_count{policy="p"} 1.0' in text
    assert 'turnout_capture_dropped_total{reason="queue_full"} 1.0' in text
    assert 'turnout_capture_degraded_total{reason="unencodable"} 1.0' in text


def test_pipeline_plugins_are_timed_and_emptying_filters_counted() -> None:
    m = Metrics()
    observer: PipelineObserver = m.policy  # the policies' observer (checked by mypy)
    backends = [BackendInfo("a", "vllm"), BackendInfo("b", "vllm")]
    params = {
        "filters": [{"type": "members", "params": {"backends": ["a"]}}],
        "scorers": ["least-requests", {"type": "least-requests", "weight": 0.5}],
    }
    policy = build_policy("p", "pipeline", params, backends, observer=observer)
    send(policy, make_request(), [cand("a"), cand("b")])
    emptied = send(policy, make_request(), [cand("b")])
    assert emptied.empty_reason == "filter 'members' (filters[0]) removed every candidate"
    text = m.render().decode()
    duration = "turnout_policy_plugin_duration_seconds_count"
    # The first run of each plugin is timed, then one in PLUGIN_SAMPLE: the filter's second
    # run (the emptied set) is not.
    assert f'{duration}{{kind="filter",plugin="members",policy="p"}} 1.0' in text
    assert f'{duration}{{kind="scorer",plugin="least-requests[0]",policy="p"}} 1.0' in text
    assert f'{duration}{{kind="scorer",plugin="least-requests[1]",policy="p"}} 1.0' in text
    assert f'{duration}{{kind="picker",plugin="max-score",policy="p"}} 1.0' in text
    rejected = 'turnout_policy_filter_rejections_total{filter="members",policy="p"} 1.0'
    assert rejected in text
    # Seconds, in buckets fine enough for sub-microsecond plugins.
    total = sample(m, "turnout_policy_plugin_duration_seconds_sum",
                   policy="p", plugin="members", kind="filter")  # fmt: skip
    assert total is not None and 0.0 < total < 0.1
    assert "turnout_policy_plugin_duration_seconds_bucket" in text
    assert sample(Metrics(), "turnout_policy_filter_rejections_total",
                  policy="p", filter="members") is None  # fmt: skip
    for _ in range(PLUGIN_SAMPLE - 1):  # runs 3 to 17 of the filter: the 17th is timed
        send(policy, make_request(), [cand("a"), cand("b")])
    timed = sample(m, duration, policy="p", plugin="members", kind="filter")
    assert timed == 2.0


def test_a_known_policy_exports_its_rejections_at_zero() -> None:
    m = Metrics()
    m.policy_known("p")
    early = {"policy": "p", "backend": "none", "class": "unknown"}
    assert sample(m, "turnout_requests_total", **early, code="401", reason="auth") == 0
    assert sample(m, "turnout_requests_total", **early, code="413", reason="too_large") == 0
    late = {"policy": "p", "backend": "none", "class": "batch"}
    assert sample(m, "turnout_requests_total", **late, code="429", reason="overloaded") == 0
    assert sample(m, "turnout_requests_total", **late, code="429", reason="quota") == 0
    assert sample(m, "turnout_requests_total", **late, code="503", reason="no_backend") == 0
    # Only the router's own rejections: outcomes of a backend appear when they happen.
    assert sample(m, "turnout_requests_total", **late, code="200", reason="ok") is None

"""The Grafana dashboard and the Prometheus alerts query only what a real router exposes.

A router runs with two emulated engines, one of which answers every request with 503, so
requests fail over and every labelled series exists; then each metric name, matcher label,
grouping label and ``le`` bucket the dashboard and the rules use is looked up in its
``/metrics``. A histogram ``x`` is queryable only as ``x_bucket``, ``x_sum`` and ``x_count``,
a counter ``y`` as ``y_total``: the names are checked as the samples are exposed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.promql import read_query
from tests.procs import ROOT, start_emulator
from tests.router.harness import base_config, client_for, get, start_router, write_config

DASHBOARD = json.loads((ROOT / "deploy/grafana/turnout.json").read_text(encoding="utf-8"))
RULES = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yaml").read_text(encoding="utf-8"))
MODEL = "deepseek-v4.1-flash"
SEVERITIES = {"critical", "warning", "info"}
# What the issue asks the dashboard to show, as the series that carry it.
REQUIRED_ON_DASHBOARD = {
    "turnout_time_to_first_token_seconds_bucket",
    "turnout_time_per_output_token_seconds_bucket",
    "turnout_e2e_request_latency_seconds_bucket",
    "turnout_requests_total",
    "turnout_failovers_total",
    "turnout_backend_up",
    "turnout_slo_attained_total",
}


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def dashboard_queries() -> list[str]:
    exprs = [n["expr"] for n in walk(DASHBOARD["panels"]) if "expr" in n]
    variables = DASHBOARD["templating"]["list"]
    exprs += [v["definition"] for v in variables if v["type"] == "query"]
    return exprs


def rule_queries() -> list[str]:
    return [r["expr"] for g in RULES["groups"] for r in g["rules"]]


def custom_values(name: str) -> list[str]:
    (var,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == name]
    return [o["value"] for o in var["options"]]


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, str]]]:
    """Sample name -> label sets, from a router that served, failed over and answered both
    request classes (streamed interactive, non-streamed flex batch)."""
    errors = ["--error-rate", "1", "--error-status", "503"]
    with (
        start_emulator("vllm", time_scale=50, args=errors) as broken,
        start_emulator("deepinfer", time_scale=50) as good,
        start_emulator("vllm", time_scale=50, args=["--drop-after", "2"]) as cut,
    ):
        backends = [
            ("broken", "vllm", broken.url),
            ("good", "deepinfer", good.url),
            ("cut", "sglang", cut.url),  # names, not engine kinds, in the policies below
        ]
        doc = base_config(backends)
        doc["policies"]["class-split"]["params"] = {
            "interactive": ["broken", "good"],
            "batch": ["good", "broken"],
        }
        # An adaptive policy gives every policy's requests SLO targets (goodput counters).
        doc["policies"]["adaptive"] = {
            "type": "adaptive",
            "params": {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]},
        }
        doc["health"]["failures_to_eject"] = 100  # keep failing over rather than eject
        path = write_config(tmp_path_factory.mktemp("router"), doc)
        with start_router(path) as router:
            client = client_for(router.url)
            for _ in range(3):
                stream = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                    stream=True,
                )  # fmt: skip
                assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                out = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "sum up"}],
                    max_tokens=4, service_tier="flex",
                )  # fmt: skip
                assert out.choices[0].message.content
            # A stream the engine breaks after its first bytes: turnout_stream_aborts_total.
            pinned = client_for(router.url, **{"X-Turnout-Policy": "cut-only"})
            with pytest.raises(openai.APIError):
                for _ in pinned.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                    stream=True,
                ):  # fmt: skip
                    pass
            text = get(router.url + "/metrics").text
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(dict(s.labels))
    return samples


def test_the_router_served_both_classes_and_failed_over(
    exposed: dict[str, list[dict[str, str]]],
) -> None:
    """Guards the fixture: the series below only exist after such traffic."""
    classes = {s["class"] for s in exposed["turnout_requests_total"]}
    assert {"interactive", "batch"} <= classes
    assert {s["backend"] for s in exposed["turnout_failovers_total"]} == {"broken"}
    assert {s["backend"] for s in exposed["turnout_stream_aborts_total"]} == {"cut"}
    assert exposed["turnout_slo_attained_total"] and exposed["turnout_slo_missed_total"]


@pytest.mark.parametrize(
    "source,exprs",
    [("dashboard", dashboard_queries()), ("alerts", rule_queries())],
)
def test_every_queried_series_and_label_exists(
    exposed: dict[str, list[dict[str, str]]], source: str, exprs: list[str]
) -> None:
    assert exprs
    for expr in exprs:
        q = read_query(expr)
        assert q.names, f"{source}: no turnout metric in {expr!r}"
        for name in q.names:
            assert name in exposed, f"{source}: {name} is not in the router's /metrics"
        for name, label, _ in q.matchers:
            labels = {k for s in exposed[name] for k in s}
            assert label in labels, f"{source}: {name} has no label {label!r}"
        labels = {k for name in q.names for s in exposed[name] for k in s}
        assert q.grouping <= labels, f"{source}: grouping by {q.grouping - labels} in {expr!r}"


def test_every_le_bucket_named_is_a_histogram_bound(
    exposed: dict[str, list[dict[str, str]]],
) -> None:
    """`le="1.0"` matches only if 1.0 is a bucket bound, spelled as the client library does."""
    exprs = dashboard_queries() + rule_queries()
    named = [
        (name, value)
        for expr in exprs
        for name, label, value in read_query(expr).matchers
        if label == "le"
    ]
    assert named
    for name, value in named:
        values = custom_values(value[1:]) if value.startswith("$") else [value]
        bounds = {s["le"] for s in exposed[name]}
        assert set(values) <= bounds, f"{name}: no bucket {set(values) - bounds}"


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    names = {n for expr in dashboard_queries() for n in read_query(expr).names}
    assert names >= REQUIRED_ON_DASHBOARD
    titles = " ".join(p["title"] for p in DASHBOARD["panels"])
    for word in ("TTFT", "TPOT", "E2E", "Request rate by backend", "Failovers", "SLO", "up"):
        assert word in titles


def test_dashboard_is_well_formed() -> None:
    panels = DASHBOARD["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]} | {"__rate_interval"}
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}"
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"]))
            assert used <= defined, f"{p['title']}: undefined variables {used - defined}"


def test_alert_rules_are_complete() -> None:
    names = []
    for group in RULES["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            names.append(rule["alert"])
            assert rule["labels"]["severity"] in SEVERITIES
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert re.fullmatch(r"\d+[smh]", rule["for"])
    assert len(names) == len(set(names))
    joined = " ".join(names)
    for topic in ("Burn", "BackendDown", "Failover"):
        assert topic in joined, f"no {topic} alert"

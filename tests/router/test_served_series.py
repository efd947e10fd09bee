"""The compact per-request series expose what prometheus_client's own metrics would.

One process keeps them as flat records (router.observe.served.Served); workers keep
prometheus_client's metrics (SharedServed), whose values its multiprocess files need. Both are
fed the same requests here, each on a registry of its own, and their /metrics text is parsed
and compared sample by sample: names, types, help, labels, buckets and values, and a
``_created`` time for every series.
"""

from __future__ import annotations

import math
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.observe.series import TTFT_BUCKETS
from router.observe.served import Served, SharedServed

Sample = tuple[str, str, tuple[tuple[str, str], ...], float]


def feed(series: Served | SharedServed) -> None:
    a, b = ("p", "vllm-0", "interactive"), ("p", "vllm-1", "batch")
    series.known(("p", "none", "unknown"), 401, "unauthorized")
    for ttft in (0.0005, 0.001, 0.05, 0.3, 59.0, 61.0, math.inf):  # edges and past the last
        series.done(a, 200, "ok", ttft, 0.02, 1.5, 12, 30)
    series.done(b, 200, "ok", 0.2, None, 0.4, 7, 1)  # one output token: no TPOT
    series.done(b, 502, "upstream_error", None, None, None, None, None)
    series.done(a, 499, "client_gone", 0.1, None, 0.1, 5, 0)
    for edge in TTFT_BUCKETS:
        series.done(b, 200, "ok", edge, edge, edge, 1, 1)  # exactly on each bound


def samples(registry: CollectorRegistry) -> tuple[list[tuple[str, str, str]], set[Sample]]:
    text = generate_latest(registry).decode()
    families, out = [], set()
    now = time.time()
    for family in text_string_to_metric_families(text):
        families.append((family.name, family.type, family.documentation))
        for s in family.samples:
            value = s.value
            if s.name.endswith("_created"):
                assert now - 60 < value <= now  # a creation time, not a count
                value = 0.0
            out.add((family.name, s.name, tuple(sorted(s.labels.items())), value))
    return families, out


def test_the_compact_series_expose_what_prometheus_client_would() -> None:
    compact, reference = CollectorRegistry(), CollectorRegistry()
    feed(Served(compact))
    feed(SharedServed(reference))
    got, want = samples(compact), samples(reference)
    assert got[0] == want[0]  # the same families, in the same order
    assert got[1] == want[1]
    names = {s[1] for s in got[1]}
    assert "turnout_time_to_first_token_seconds_bucket" in names
    assert "turnout_requests_created" in names and "turnout_prompt_tokens_created" in names


def test_a_record_counts_each_outcome_and_observation() -> None:
    registry = CollectorRegistry()
    series = Served(registry)
    labels = {"policy": "p", "backend": "b", "class": "interactive"}
    for _ in range(3):
        series.done(("p", "b", "interactive"), 200, "ok", 0.05, 0.01, 1.0, 10, 20)
    series.known(("p", "b", "interactive"), 503, "no_backend")

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**labels, **extra})

    assert value("turnout_requests_total", code="200", reason="ok") == 3
    assert value("turnout_requests_total", code="503", reason="no_backend") == 0
    assert value("turnout_time_to_first_token_seconds_bucket", le="0.05") == 3
    assert value("turnout_time_to_first_token_seconds_bucket", le="0.04") == 0
    assert value("turnout_time_to_first_token_seconds_count") == 3
    assert value("turnout_time_to_first_token_seconds_sum") == 3 * 0.05
    assert value("turnout_prompt_tokens_total") == 30
    assert value("turnout_output_tokens_total") == 60

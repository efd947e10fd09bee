"""The pipeline runner: clamped scores, per-plugin timing, and naming the filter that emptied
the candidate set (in the decision and to the observer)."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from policies.base import PipelineObserver, PluginKind
from policies.filters import ClassMembersFilter, MembersFilter, NotSaturatedFilter
from policies.pickers import RoundRobinPicker
from policies.pipeline import NO_HEALTHY, PipelinePolicy, plugin_labels, plugin_type
from policies.registry import BackendInfo, build_policy
from policies.scorers import LoadScorer, PredictedTtftScorer
from policies.signals import inflight
from policies.testing import make_candidate as cand
from policies.testing import make_request, send
from policies.types import Candidate, Outcome, RequestInfo

BACKENDS = (BackendInfo("a", "vllm"), BackendInfo("b", "vllm"), BackendInfo("c", "deepinfer"))


@dataclass
class Recorder:
    """A PipelineObserver that keeps what it was told."""

    bound: list[tuple[str, PluginKind, str]] = field(default_factory=list)
    runs: list[tuple[str, PluginKind, str, float]] = field(default_factory=list)
    emptied: list[tuple[str, str]] = field(default_factory=list)

    def plugin_timer(self, policy: str, kind: PluginKind, plugin: str) -> Callable[[float], None]:
        self.bound.append((policy, kind, plugin))
        return lambda seconds: self.runs.append((policy, kind, plugin, seconds))

    def filter_emptied(self, policy: str, filter: str) -> Callable[[], None]:
        return lambda: self.emptied.append((policy, filter))

    def ran(self) -> list[tuple[PluginKind, str]]:
        return [(kind, plugin) for _, kind, plugin, _ in self.runs]


@dataclass(frozen=True)
class Fixed:
    """A scorer that returns the same (possibly out-of-range) values every time."""

    values: Mapping[str, float]

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]:
        return self.values


def test_recorder_is_an_observer() -> None:
    observer: PipelineObserver = Recorder()  # checked by mypy
    assert observer.filter_emptied("p", "f") is not None


def test_out_of_range_and_nan_scores_are_clamped() -> None:
    rogue = Fixed({"a": 1.7, "b": -3.0, "c": math.nan})
    honest = Fixed({"a": 0.0, "b": 0.9, "c": 0.95})
    policy = PipelinePolicy("p", "pipeline", scorers=((rogue, 1.0), (honest, 2.0)))
    decision = send(policy, make_request(), [cand("a"), cand("b"), cand("c")])
    # Unclamped, "a" would win on 1.7 and "c" would be NaN.
    assert decision.scores == {"a": 1.0, "b": 1.8, "c": 1.9}
    assert decision.ranked == ("c", "b", "a")


@pytest.mark.parametrize(
    ("value", "clamped"),
    [(math.inf, 1.0), (-math.inf, 0.0), (math.nan, 0.0), (1.0, 1.0), (0.0, 0.0), (0.25, 0.25)],
)
def test_each_value_lands_in_the_unit_interval(value: float, clamped: float) -> None:
    policy = PipelinePolicy("p", "pipeline", scorers=((Fixed({"a": value}), 3.0),))
    assert send(policy, make_request(), [cand("a")]).scores == {"a": 3.0 * clamped}


def test_a_filter_that_empties_the_set_is_named_and_counted() -> None:
    recorder = Recorder()
    params = {
        "filters": ["not-saturated", {"type": "members", "params": {"backends": ["c"]}}],
        "scorers": ["least-requests"],
    }
    policy = build_policy("p", "pipeline", params, BACKENDS, observer=recorder)
    decision = send(policy, make_request(), [cand("a"), cand("b"), cand("c", healthy=False)])
    assert decision.ranked == ()
    assert decision.empty_reason == "filter 'members' (filters[1]) removed every candidate"
    assert recorder.emptied == [("p", "members")]
    # Both filters ran and were timed; nothing after the emptying filter ran.
    assert recorder.ran() == [("filter", "not-saturated"), ("filter", "members")]
    # A request that keeps a candidate neither counts nor gives a reason.
    kept = send(policy, make_request(), [cand("a"), cand("c")])
    assert kept.ranked == ("c",)
    assert kept.empty_reason is None
    assert recorder.emptied == [("p", "members")]


def test_class_split_names_its_class_members_filter() -> None:
    recorder = Recorder()
    params = {"interactive": ["vllm"], "batch": ["deepinfer"]}
    policy = build_policy("p", "class-split", params, BACKENDS, observer=recorder)
    decision = send(policy, make_request("interactive"), [cand("c", "deepinfer")])
    assert decision.ranked == ()
    assert decision.empty_reason == "filter 'class-members' (filters[0]) removed every candidate"
    assert recorder.emptied == [("p", "class-members")]


def test_no_healthy_candidate_blames_no_filter() -> None:
    recorder = Recorder()
    policy = PipelinePolicy(
        "p", "pipeline", filters=(MembersFilter(frozenset({"a"})),), observer=recorder
    )
    decision = send(policy, make_request(), [cand("a", healthy=False)])
    assert decision.ranked == ()
    assert decision.empty_reason == NO_HEALTHY
    assert recorder.emptied == []
    assert recorder.runs == []


def test_every_plugin_is_timed_once_per_request_under_its_configured_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("sy_test_pipeline_plugins")
    module.keep_all = lambda params, backends: NotSaturatedFilter()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    recorder = Recorder()
    params = {
        "filters": [f"{module.__name__}:keep_all", "not-saturated"],
        "scorers": [
            "least-requests",
            {"type": "kv-cache", "weight": 0.5},
            {"type": "least-requests", "weight": 2},
        ],
        "picker": "round-robin",
    }
    policy = build_policy("p", "pipeline", params, BACKENDS, observer=recorder)
    expected: list[tuple[PluginKind, str]] = [
        ("filter", f"{module.__name__}:keep_all"),
        ("filter", "not-saturated"),
        # a type listed twice gets its position in the list
        ("scorer", "least-requests[0]"),
        ("scorer", "kv-cache"),
        ("scorer", "least-requests[2]"),
        ("picker", "round-robin"),
    ]
    # Series are bound once, at build time, not per request.
    assert [(kind, plugin) for _, kind, plugin in recorder.bound] == expected
    for _ in range(3):
        send(policy, make_request(), [cand("a"), cand("b")])
    assert recorder.ran() == expected * 3
    assert {policy for policy, *_ in recorder.runs} == {"p"}
    assert all(0.0 <= seconds < 1.0 for *_, seconds in recorder.runs)
    assert len(recorder.bound) == len(expected)


@pytest.mark.parametrize(
    ("plugin", "name"),
    [
        (ClassMembersFilter({}), "class-members"),
        (NotSaturatedFilter(), "not-saturated"),
        (LoadScorer(inflight), "load"),
        (RoundRobinPicker(), "round-robin"),
        (Fixed({}), "fixed"),
    ],
)
def test_plugins_built_in_code_get_a_type_from_their_class(plugin: object, name: str) -> None:
    assert plugin_type(plugin) == name


def test_labels_prefer_the_configured_type_and_mark_repeats() -> None:
    plugins = [LoadScorer(inflight), LoadScorer(inflight), Fixed({})]
    assert plugin_labels(("least-requests", "", "mine:f"), plugins) == [
        ("least-requests", "least-requests"),
        ("load", "load"),
        ("mine:f", "mine:f"),
    ]
    assert plugin_labels((), plugins) == [
        ("load", "load[0]"),
        ("load", "load[1]"),
        *[("fixed",) * 2],
    ]


def test_learners_still_get_outcomes_when_observed() -> None:
    recorder = Recorder()
    policy = build_policy(
        "p", "pipeline", {"scorers": ["predicted-ttft"]}, BACKENDS, observer=recorder
    )
    assert isinstance(policy, PipelinePolicy)
    assert [type(learner) for learner in policy.learners] == [PredictedTtftScorer]
    assert recorder.bound == [("p", "scorer", "predicted-ttft"), ("p", "picker", "max-score")]


def test_a_pipelines_predicted_ttft_learns_what_another_instance_teaches() -> None:
    """Two processes' instances of one pipeline: the lessons of one's requests move the
    other's predicted-ttft scores as its own would (policies.base.SharesLearning)."""
    params = {"scorers": [{"type": "predicted-ttft", "params": {"prefill_rate_prior": 10_000}}]}
    served, taught = (build_policy("p", "pipeline", params, BACKENDS) for _ in range(2))
    assert isinstance(served, PipelinePolicy) and isinstance(taught, PipelinePolicy)
    assert served.shares_learning and taught.shares_learning
    cands = [cand(b.name) for b in BACKENDS]
    slow = BACKENDS[0].name
    for i in range(30):
        req = make_request(request_id=f"r{i}", prompt_tokens=1000)
        decision = served.choose(req, cands)
        served.committed(req, decision, slow)
        outcome = Outcome(200, True, 1000, 10, ttft_s=2.0)
        lesson = served.lesson(req, slow, outcome)
        assert lesson is not None
        served.on_finish(req, slow, outcome)
        taught.taught(lesson)
    asked = make_request(request_id="q", prompt_tokens=1000)
    fresh = build_policy("p", "pipeline", params, BACKENDS)
    assert fresh.choose(asked, cands).ranked[0] == slow  # untaught: the first of equals
    assert served.choose(asked, cands).ranked[0] != slow
    assert taught.choose(asked, cands).scores == served.choose(asked, cands).scores

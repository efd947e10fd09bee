"""Building policies from config: each built-in type's behaviour and every validation error."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping, Sequence

import pytest

from policies.filters import MembersFilter
from policies.pipeline import PipelinePolicy
from policies.registry import BackendInfo, PolicyConfigError, build_policy, policy_types
from policies.testing import make_candidate as cand
from policies.testing import make_request, send
from policies.types import Candidate

BACKENDS = (
    BackendInfo("vllm", "vllm", priority_capable=True),
    BackendInfo("vllm-2", "vllm", priority_capable=True),
    BackendInfo("deepinfer", "deepinfer"),
)


def snapshot(**inflight: int) -> list[Candidate]:
    """One candidate per backend, with the given in-flight counts (names use _ for -)."""
    return [
        cand(b.name, b.engine, inflight=inflight.get(b.name.replace("-", "_"), 0)) for b in BACKENDS
    ]


def ranked(
    policy_type: str,
    params: Mapping[str, object],
    cands: Sequence[Candidate],
    cls: str = "interactive",
) -> list[str]:
    policy = build_policy("p", policy_type, params, BACKENDS)
    return list(send(policy, make_request(cls), cands).ranked)  # type: ignore[arg-type]


def test_builtin_types_listed() -> None:
    assert set(policy_types()) >= {
        "class-split",
        "round-robin",
        "least-outstanding",
        "pinned",
        "pipeline",
    }


SPLIT = {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]}


@pytest.mark.parametrize(
    ("cls", "cands", "expected"),
    [
        ("interactive", snapshot(), ["vllm", "vllm-2", "deepinfer"]),
        # replicas of one tier are balanced by in-flight; tiers never swap however loaded
        ("interactive", snapshot(vllm=5, vllm_2=1), ["vllm-2", "vllm", "deepinfer"]),
        ("interactive", snapshot(vllm=50, vllm_2=50), ["vllm", "vllm-2", "deepinfer"]),
        ("batch", snapshot(deepinfer=99), ["deepinfer", "vllm", "vllm-2"]),
        # unhealthy filtered out
        (
            "batch",
            [cand("vllm"), cand("vllm-2", "vllm"), cand("deepinfer", healthy=False)],
            ["vllm", "vllm-2"],
        ),
        ("batch", [cand("deepinfer", healthy=False)], []),
    ],
)
def test_class_split(cls: str, cands: list[Candidate], expected: list[str]) -> None:
    assert ranked("class-split", SPLIT, cands, cls) == expected


def test_class_split_by_backend_name_excludes_unlisted() -> None:
    params = {"interactive": ["vllm-2"], "batch": ["deepinfer"]}
    assert ranked("class-split", params, snapshot()) == ["vllm-2"]


def test_round_robin_over_subset() -> None:
    policy = build_policy("rr", "round-robin", {"backends": ["vllm"]}, BACKENDS)
    heads = [send(policy, make_request(), snapshot()).ranked for _ in range(3)]
    assert heads == [("vllm", "vllm-2"), ("vllm-2", "vllm"), ("vllm", "vllm-2")]


def test_round_robin_all() -> None:
    policy = build_policy("rr", "round-robin", {}, BACKENDS)
    heads = [send(policy, make_request(), snapshot()).ranked[0] for _ in range(4)]
    assert heads == ["vllm", "vllm-2", "deepinfer", "vllm"]


@pytest.mark.parametrize(
    ("params", "cands", "expected"),
    [
        ({}, snapshot(vllm=3, vllm_2=1, deepinfer=2), ["vllm-2", "deepinfer", "vllm"]),
        (
            {"by": "requests"},
            snapshot(vllm=0, vllm_2=1, deepinfer=2),
            ["vllm", "vllm-2", "deepinfer"],
        ),
        (
            {"by": "tokens"},
            [
                cand("vllm", inflight=1, prompt_tokens=9000),
                cand("vllm-2", "vllm", inflight=5, prompt_tokens=100, output_tokens=100),
                cand("deepinfer", inflight=0, output_tokens=4000),
            ],
            ["vllm-2", "deepinfer", "vllm"],
        ),
        ({"backends": ["deepinfer", "vllm-2"]}, snapshot(vllm_2=7), ["deepinfer", "vllm-2"]),
    ],
)
def test_least_outstanding(
    params: dict[str, object], cands: list[Candidate], expected: list[str]
) -> None:
    assert ranked("least-outstanding", params, cands) == expected


@pytest.mark.parametrize(
    ("params", "cands", "expected"),
    [
        ({"engine": "vllm"}, snapshot(vllm=2), ["vllm-2", "vllm"]),
        ({"engine": "deepinfer"}, snapshot(), ["deepinfer"]),
        ({"backend": "vllm"}, snapshot(), ["vllm"]),
        ({"backend": "vllm"}, [cand("vllm", healthy=False), cand("deepinfer")], []),
    ],
)
def test_pinned(params: dict[str, object], cands: list[Candidate], expected: list[str]) -> None:
    assert ranked("pinned", params, cands) == expected


def test_pipeline_composes_plugins() -> None:
    params = {
        "filters": [
            "not-saturated",
            {"type": "members", "params": {"backends": ["vllm-2", "deepinfer"]}},
        ],
        "scorers": [
            {"type": "queue-depth", "weight": 2},
            {"type": "kv-cache", "weight": 1},
            {"type": "least-tokens", "weight": 0},
        ],
        "picker": {"type": "max-score"},
    }
    cands = [
        cand("vllm", waiting=0, kv=0.0, inflight=8, max_inflight=8),
        cand("vllm-2", "vllm", waiting=3, kv=0.1, output_tokens=1),
        cand("deepinfer", waiting=1, kv=0.95),
    ]
    # vllm is saturated; deepinfer: 2*1 + 1*0 = 2 beats vllm-2: 2*0 + 1*1 = 1
    policy = build_policy("p", "pipeline", params, BACKENDS)
    decision = send(policy, make_request(), cands)
    assert decision.ranked == ("deepinfer", "vllm-2")
    assert decision.scores == {"deepinfer": 2.0, "vllm-2": 1.0}


def test_pipeline_defaults_to_max_score_with_no_scorers() -> None:
    assert ranked("pipeline", {}, snapshot()) == ["vllm", "vllm-2", "deepinfer"]


@pytest.mark.parametrize(
    ("policy_type", "params", "errors"),
    [
        ("least-qeue", {}, [("type", "unknown policy type 'least-qeue' (known: ")]),
        ("adaptve", {}, [("type", "unknown policy type 'adaptve' (did you mean 'adaptive'?)")]),
        (
            "class-split",
            {"interactive": ["vlm"], "batch": "deepinfer", "extra": 1},
            [
                (
                    "params.interactive[0]",
                    "unknown backend or engine 'vlm' (did you mean 'vllm'?)",
                ),
                ("params.extra", "unknown key"),
                ("params.batch", "expected a list of strings, got string"),
            ],
        ),
        (
            "class-split",
            {"interactive": ["vllm", "vllm-2"]},
            [
                ("params.batch", "is required"),
                ("params.interactive[1]", "'vllm-2' repeats a backend listed before it"),
            ],
        ),
        (
            "class-split",
            {"interactive": [], "batch": [3]},
            [
                ("params.interactive", "must list at least one"),
                ("params.batch[0]", "expected a non-empty string, got number"),
            ],
        ),
        ("class-split", ["vllm"], [("params", "expected a mapping, got list")]),
        (
            "least-outstanding",
            {"by": "bytes", "backends": 5},
            [
                ("params.by", "expected one of requests, tokens, got string"),
                ("params.backends", "expected a list of strings, got number"),
            ],
        ),
        ("round-robin", {"backends": []}, [("params.backends", "must list at least one")]),
        ("pinned", {}, [("params.backend", "give exactly one of")]),
        (
            "pinned",
            {"backend": "vllm", "engine": "vllm"},
            [("params.backend", "give exactly one of")],
        ),
        (
            "pinned",
            {"engine": "sglang"},
            [("params.engine", "unknown engine 'sglang' (known: vllm, deepinfer)")],
        ),
        ("pinned", {"backend": "x"}, [("params.backend", "unknown backend 'x'")]),
        (
            "pinned",
            {"backend": "deepinfr"},
            [("params.backend", "unknown backend 'deepinfr' (did you mean 'deepinfer'?)")],
        ),
        (
            "pipeline",
            {
                "filters": [{"type": "members"}, {"type": "nope"}],
                "scorers": [
                    {"type": "queue-depth", "weight": -1},
                    {"type": "least-qeue"},
                    {"typo": 1},
                ],
                "picker": {"type": "max-score", "params": {"x": 1}},
            },
            [
                ("params.filters[0].params.backends", "is required"),
                ("params.filters[1].type", "unknown plugin type 'nope' (known: members, "),
                ("params.scorers[0].weight", "-1 is below the minimum 0"),
                (
                    "params.scorers[1].type",
                    "unknown plugin type 'least-qeue' (did you mean 'least-requests'?)",
                ),
                ("params.scorers[2].typo", "unknown key"),
                ("params.scorers[2].type", "is required"),
                ("params.picker.params.x", "unknown key"),
            ],
        ),
        (
            "pipeline",
            {"filters": {"type": "members"}},
            [("params.filters", "expected a list, got mapping")],
        ),
        ("no.such.module:thing", {}, [("type", "cannot load 'no.such.module:thing'")]),
    ],
)
def test_config_errors_all_reported_with_paths(
    policy_type: str, params: object, errors: list[tuple[str, str]]
) -> None:
    with pytest.raises(PolicyConfigError) as info:
        build_policy("p", policy_type, params, BACKENDS)  # type: ignore[arg-type]
    got = info.value.errors
    assert len(got) == len(errors), got
    for (path, message), (want_path, want_message) in zip(sorted(got), sorted(errors), strict=True):
        assert path == want_path
        assert message.startswith(want_message), (path, message)


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> str:
    """An out-of-tree plugin module, importable by name for this test only."""
    module = types.ModuleType("sy_test_plugins")

    def only(params: Mapping[str, object], backends: Sequence[BackendInfo]) -> MembersFilter:
        if set(params) != {"name"}:
            raise ValueError("needs exactly 'name'")
        return MembersFilter(frozenset({str(params["name"])}))

    def whole(
        name: str, params: Mapping[str, object], backends: Sequence[BackendInfo]
    ) -> PipelinePolicy:
        return PipelinePolicy(
            name, "custom", filters=(MembersFilter(frozenset({backends[-1].name})),)
        )

    module.only = only  # type: ignore[attr-defined]
    module.whole = whole  # type: ignore[attr-defined]
    module.not_callable = 3  # type: ignore[attr-defined]
    module.wrong = lambda params, backends: "not a filter"  # type: ignore[attr-defined]
    module.no_policy = lambda name, params, backends: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_out_of_tree_plugins(plugin_module: str) -> None:
    params = {"filters": [{"type": f"{plugin_module}:only", "params": {"name": "vllm-2"}}]}
    assert ranked("pipeline", params, snapshot()) == ["vllm-2"]
    assert ranked(f"{plugin_module}:whole", {}, snapshot()) == ["deepinfer"]


def test_out_of_tree_errors(plugin_module: str) -> None:
    params = {
        "filters": [
            {"type": f"{plugin_module}:only", "params": {}},
            f"{plugin_module}:not_callable",
            f"{plugin_module}:wrong",
            f"{plugin_module}:absent",
            f"{plugin_module}:whole",  # a policy factory: wrong signature for a filter
            ":nothing",
        ]
    }
    with pytest.raises(PolicyConfigError) as info:
        build_policy("p", "pipeline", params, BACKENDS)
    assert [p for p, _ in info.value.errors] == [
        "params.filters[0].params",
        "params.filters[1].type",
        "params.filters[2].type",
        "params.filters[3].type",
        "params.filters[4].params",
        "params.filters[5].type",
    ]
    assert "needs exactly 'name'" in str(info.value)


def test_out_of_tree_policy_that_is_not_a_policy_is_an_error(plugin_module: str) -> None:
    # It used to raise PolicyConfigError([]): no error listed, so check-config said "ok".
    with pytest.raises(PolicyConfigError) as info:
        build_policy("p", f"{plugin_module}:no_policy", {}, BACKENDS)
    assert info.value.errors == [("type", f"'{plugin_module}:no_policy' did not return a Policy")]

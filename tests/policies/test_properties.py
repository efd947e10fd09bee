"""Property: every policy ranks a duplicate-free subset of the candidates it was given."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.registry import BackendInfo, build_policy
from policies.testing import make_candidate, make_request, send
from policies.types import Candidate, Outcome

BACKENDS = (
    BackendInfo("vllm", "vllm", priority_capable=True),
    BackendInfo("vllm-2", "vllm", priority_capable=True),
    BackendInfo("deepinfer", "deepinfer"),
    BackendInfo("deepinfer-2", "deepinfer"),
)

# (type, params, whether the ranking must hold every healthy candidate)
CONFIGS: tuple[tuple[str, Mapping[str, object], bool], ...] = (
    ("class-split", {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]}, True),
    ("class-split", {"interactive": ["vllm-2"], "batch": ["deepinfer"]}, False),
    ("round-robin", {}, True),
    ("round-robin", {"backends": ["vllm"]}, False),
    ("least-outstanding", {"by": "requests"}, True),
    ("least-outstanding", {"by": "tokens"}, True),
    ("pinned", {"engine": "deepinfer"}, False),
    (
        "pipeline",
        {
            "filters": ["not-saturated"],
            "scorers": [{"type": "queue-depth"}, {"type": "kv-cache", "weight": 0.5}],
        },
        False,
    ),
    ("adaptive", {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}, True),
    (
        "adaptive",
        {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"], "spill": {"max_inflight": 1}},
        True,
    ),
    (
        "pipeline",
        {"scorers": [{"type": "predicted-ttft"}, {"type": "session-affinity", "weight": 0.3}]},
        True,
    ),
)


@st.composite
def snapshots(draw: st.DrawFn) -> list[Candidate]:
    chosen = draw(st.lists(st.sampled_from(BACKENDS), unique=True))
    out = []
    for b in chosen:
        scraped = draw(st.booleans())
        out.append(
            make_candidate(
                b.name,
                b.engine,
                healthy=draw(st.booleans()),
                inflight=draw(st.integers(0, 64)),
                max_inflight=draw(st.one_of(st.none(), st.integers(1, 64))),
                prompt_tokens=draw(st.integers(0, 100_000)),
                output_tokens=draw(st.integers(0, 100_000)),
                waiting=draw(st.floats(0, 100)) if scraped else None,
                kv=draw(st.floats(0, 1)) if scraped else None,
                stale=draw(st.booleans()),
                priority_capable=b.priority_capable,
            )
        )
    return out


@settings(max_examples=60, deadline=None)
@given(
    config=st.sampled_from(CONFIGS),
    cands=snapshots(),
    cls=st.sampled_from(["interactive", "batch"]),
    repeats=st.integers(1, 3),
)
def test_ranking_is_a_subset_permutation(
    config: tuple[str, Mapping[str, object], bool], cands: list[Candidate], cls: str, repeats: int
) -> None:
    policy_type, params, complete = config
    policy = build_policy("p", policy_type, params, BACKENDS)
    healthy = {c.name for c in cands if c.healthy}
    for _ in range(repeats):
        ranked = send(policy, make_request(cls), cands).ranked  # type: ignore[arg-type]
        assert len(ranked) == len(set(ranked))
        assert set(ranked) <= healthy
        if complete:
            assert set(ranked) == healthy


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["interactive", "batch"]),
            snapshots(),
            st.booleans(),  # finish it at once?
            st.floats(0.01, 3.0),  # observed TTFT
        ),
        max_size=40,
    )
)
def test_adaptive_bookkeeping_balances(
    steps: list[tuple[str, list[Candidate], bool, float]],
) -> None:
    """Spill slots are released by on_finish whatever the interleaving; the limit stays in range."""
    policy = build_policy(
        "a", "adaptive", {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}, BACKENDS
    )
    open_: list[tuple[object, str]] = []
    for i, (cls, cands, finish_now, ttft) in enumerate(steps):
        req = make_request(cls, request_id=f"r{i}", stream=cls == "interactive")  # type: ignore[arg-type]
        ranked = send(policy, req, cands).ranked
        assert len(ranked) == len(set(ranked)) and set(ranked) == {
            c.name for c in cands if c.healthy
        }
        if ranked:
            open_.append((req, ranked[0]))
        if finish_now and open_:
            done, backend = open_.pop(0)
            policy.on_finish(done, backend, Outcome(200, True, 1000, 100, ttft, ttft + 1, 0.01))  # type: ignore[arg-type]
        assert 0 <= policy.governor.limit <= 4  # type: ignore[attr-defined]
    for done, backend in open_:
        policy.on_finish(done, backend, Outcome(502, False))  # type: ignore[arg-type]
    assert all(policy.spilled(b.name) == 0 for b in BACKENDS)  # type: ignore[attr-defined]

"""Cache-aware routing on candidate snapshots: the block chain, the index, the load gate."""

from __future__ import annotations

import pytest

from policies.adaptive import AdaptivePolicy
from policies.prefix import (
    BLOCK_CHARS,
    DEFAULT_CAPACITY,
    RECALL,
    CacheAwarePolicy,
    PrefixIndex,
    prompt_blocks,
)
from policies.registry import PolicyConfigError, build_policy
from policies.testing import make_candidate, make_request, send
from policies.types import BackendInfo, Candidate, EngineLoad, Outcome, RequestInfo

NAMES = ("a", "b", "c")
BACKENDS = [BackendInfo(n, "vllm") for n in NAMES]
OK = Outcome(200, True)
FAILED = Outcome(503, False)
SHARED = "system prompt shared by a whole tenant. " * 40  # 1,600 characters: 6 blocks


def request(text: str, request_id: str = "r") -> RequestInfo:
    return make_request(request_id=request_id, prefix_blocks=prompt_blocks(text))


def cands(*loads: int, saturated: str | None = None) -> list[Candidate]:
    loads = loads or (0,) * len(NAMES)
    return [
        make_candidate(n, "vllm", inflight=x, max_inflight=x if n == saturated else None)
        for n, x in zip(NAMES, loads, strict=True)
    ]


def cache_aware(**params: object) -> CacheAwarePolicy:
    policy = build_policy("ca", "cache-aware", params, BACKENDS)
    assert isinstance(policy, CacheAwarePolicy)
    return policy


def test_block_chain_covers_full_blocks_and_names_prefixes() -> None:
    one = prompt_blocks(SHARED + "first question " * 20)
    two = prompt_blocks(SHARED + "second, much longer question " * 20)
    assert len(one) == len(SHARED + "first question " * 20) // BLOCK_CHARS == 7
    shared = len(SHARED) // BLOCK_CHARS
    assert one[:shared] == two[:shared] and one[shared:] != two[shared : len(one)]
    # A different first block changes every hash after it, even over equal text.
    other = prompt_blocks("x" * BLOCK_CHARS + SHARED[BLOCK_CHARS:])
    assert not set(other) & set(one)
    assert prompt_blocks("short") == ()


def test_index_forgets_least_recently_routed_and_the_tail_before_the_head() -> None:
    index = PrefixIndex(capacity=8, backends=NAMES)
    first, second = prompt_blocks("a" * 1600), prompt_blocks("b" * 1600)
    index.record("a", first)
    index.record("a", second)  # 12 blocks routed, 8 kept: first's tail went
    assert index.matched("a", first) == 2 and index.matched("a", second) == 6
    index.record("a", first[:2])  # first's head used again: now second's tail goes first
    index.record("a", prompt_blocks("c" * 512))
    assert index.matched("a", first) == 2 and index.matched("a", second) == 4
    index.record("nobody", first)  # not a configured backend: ignored, memory stays bounded
    assert index.size("nobody") == 0 and index.size("a") == 8


def test_the_record_is_sized_after_each_engine_s_kv_cache() -> None:
    # 100 blocks of 40 tokens each: a 4,000-token prompt of 25,600 characters
    prompt = make_request(prompt_tokens=4000, prefix_blocks=prompt_blocks("p" * 25600))
    assert len(prompt.prefix_blocks) == 100

    def sized(kv: float | None) -> Candidate:
        return Candidate("a", "vllm", load=EngineLoad(kv_cache_tokens=kv))

    index = PrefixIndex(backends=NAMES)
    index.observe(prompt, [sized(None), sized(None)])
    assert index.capacity_of("a") == DEFAULT_CAPACITY  # the engine has not said
    index.observe(prompt, [sized(2000.0)])  # a cache of 2,000 tokens holds 50 such blocks
    assert index.capacity_of("a") == int(RECALL * 50)
    index.record("a", prompt.prefix_blocks)
    assert index.size("a") == min(100, int(RECALL * 50))
    index.observe(prompt, [sized(400.0)])  # it shrank (a restart with less memory)
    index.record("a", prompt_blocks("q" * 2560))
    assert index.size("a") == int(RECALL * 10)
    fixed = PrefixIndex(capacity=7, backends=NAMES)
    fixed.observe(prompt, [sized(400.0)])  # capacity_blocks given: the engine is not asked
    assert fixed.capacity_of("a") == 7


def test_sticks_to_the_warm_backend_until_it_is_saturated_then_spreads() -> None:
    policy = cache_aware(max_imbalance=3)
    # Cold: the least loaded backend, which the policy then remembers at once.
    first = send(policy, request(SHARED + "q1"), cands(2, 0, 1)).ranked
    assert first == ("b", "c", "a")
    assert send(policy, request(SHARED + "q2"), cands(0, 2, 0)).ranked[0] == "b"
    # Busier than the least busy by max_imbalance: spread to the least loaded.
    spread = send(policy, request(SHARED + "q3"), cands(1, 4, 2))
    assert spread.ranked == ("a", "c", "b")
    assert (spread.scores["b"], spread.scores["a"]) == (1.0, 0.0)
    # Both now hold the prefix; the less loaded of them wins, the cold one is last.
    assert send(policy, request(SHARED + "q4"), cands(2, 1, 0)).ranked == ("b", "a", "c")
    assert (
        send(
            policy,
            request(SHARED + "q5"),
            cands(0, 0, 0),
        ).ranked[0]
        == "a"
    )
    # A backend at its max_inflight is closed to stickiness.
    assert send(policy, request(SHARED + "q6"), cands(1, 1, 0, saturated="a")).ranked[0] == "b"


def test_spreads_when_the_warm_queue_costs_more_than_a_miss_not_by_request_counts() -> None:
    policy = cache_aware()
    warm = request(SHARED + "question " * 30)  # 7 blocks, 6 of them the shared prefix
    policy.on_finish(warm, "a", OK)
    ask = make_request(prompt_tokens=1000, prefix_blocks=(*warm.prefix_blocks[:6], 1))
    assert policy.index.matched("a", ask.prefix_blocks) == 6

    def loads(*queued: tuple[int, int]) -> list[Candidate]:
        return [
            make_candidate(n, "vllm", inflight=k, prompt_tokens=t)
            for n, (k, t) in zip(NAMES, queued, strict=True)
        ]

    # Six more requests in flight than the others, but little prefill waiting: stays warm
    # (1,200 queued + 4 x 143 missed tokens, against 4 x 1,000 on a cold backend).
    assert send(policy, ask, loads((6, 1200), (0, 0), (0, 0))).ranked[0] == "a"
    # As many in flight everywhere, but 5,000 tokens waiting on the warm one: a miss is cheaper.
    assert send(policy, ask, loads((1, 5000), (1, 0), (1, 300))).ranked == ("b", "c", "a")
    # A cold prompt goes where the least prefill waits, however many requests are open there.
    cold = make_request(prompt_tokens=1000, prefix_blocks=prompt_blocks("z" * 2000))
    assert send(policy, cold, loads((1, 900), (0, 8000), (3, 100))).ranked[0] == "c"


def test_a_warm_queue_of_cache_hits_counts_for_what_it_misses() -> None:
    index = PrefixIndex(backends=NAMES)
    loaded = make_candidate("a", "vllm", inflight=4, prompt_tokens=10000)
    assert index.queued_prefill(loaded) == 10000  # nothing routed yet: all of it uncached
    for _ in range(30):
        index.routed("a", 0.1)  # nine tenths of each prompt sent there was held there
    assert 1000 < index.queued_prefill(loaded) < 1500
    index.routed("nobody", 0.0)  # not a configured backend: ignored
    assert index.queued_prefill(make_candidate("nobody", prompt_tokens=100)) == 100
    index.forget("a")
    assert index.queued_prefill(loaded) == 10000


def test_learns_where_requests_were_served_not_where_they_failed() -> None:
    policy = cache_aware()
    req = request(SHARED + "question")
    policy.on_finish(req, "c", FAILED)
    assert policy.index.matched("c", req.prefix_blocks) == 0
    policy.on_finish(req, "c", OK)  # served by c (say after a failover): c holds it now
    assert policy.index.matched("c", req.prefix_blocks) == 6
    assert send(policy, request(SHARED + "again"), cands(0, 0, 1)).ranked[0] == "c"


def test_unhealthy_backends_and_the_backends_param() -> None:
    policy = cache_aware(backends=["b", "c"])
    ranked = send(policy, request(SHARED), cands()).ranked
    assert set(ranked) == {"b", "c"}
    down = [make_candidate(n, "vllm", healthy=False) for n in NAMES]
    assert send(policy, request(SHARED), down).ranked == ()
    with pytest.raises(PolicyConfigError) as err:
        build_policy("ca", "cache-aware", {"max_imbalance": 0, "backends": ["z"]}, BACKENDS)
    paths = [path for path, _ in err.value.errors]
    assert paths == ["params.max_imbalance", "params.backends[0]"]


def test_as_a_pipeline_scorer() -> None:
    params = {
        "scorers": [{"type": "cache-aware", "params": {"max_imbalance": 2}}, "least-requests"]
    }
    policy = build_policy("p", "pipeline", params, BACKENDS)
    req = request(SHARED + "q")
    policy.on_finish(req, "c", OK)
    assert send(policy, request(SHARED + "q2"), cands(1, 1, 1)).ranked[0] == "c"
    assert send(policy, request(SHARED + "q3"), cands(0, 0, 2)).ranked[0] != "c"  # gated
    assert send(policy, request("x" * 2000), cands(1, 0, 1)).ranked[0] == "b"  # cold


def test_adaptive_keeps_a_request_on_its_cache_warm_replica_in_the_pool() -> None:
    backends = [BackendInfo(n, "vllm") for n in NAMES] + [BackendInfo("d", "deepinfer")]
    params = {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}
    policy = build_policy("ad", "adaptive", params, backends)
    assert isinstance(policy, AdaptivePolicy)
    pool = [*cands(0, 0, 0), make_candidate("d", "deepinfer")]
    first = send(policy, request(SHARED + "q1"), pool).ranked[0]
    loaded = [
        make_candidate(
            n, "vllm", inflight=1 if n == first else 0, prompt_tokens=5000 * (n == first)
        )
        for n in NAMES
    ] + [make_candidate("d", "deepinfer")]
    assert send(policy, request(SHARED + "q2"), loaded).ranked[0] == first

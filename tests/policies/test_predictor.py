"""The online TTFT predictor, driven by a simulated FCFS prefill queue in virtual time."""

from __future__ import annotations

import random

import pytest

from policies.predictor import TpotTracker, TtftPredictor, queued_prefill_tokens
from policies.scorers import PredictedTtftScorer
from policies.testing import make_candidate, make_request
from policies.types import Lesson, Outcome


def simulate(
    scorer: PredictedTtftScorer, rate: float, n: int, seed: int = 7
) -> list[tuple[float, float]]:
    """Poisson arrivals on one engine prefilling ``rate`` tokens/s, first come first served.

    The router-side snapshot at each arrival holds the prompt tokens still to prefill; each
    outcome is fed back at its (virtual) finish time, after any arrivals before it. Returns
    (predicted, actual) TTFT pairs.
    """
    rng = random.Random(seed)
    now = busy_until = 0.0
    pending: list[tuple[float, str, int, float]] = []  # (first token at, id, prompt, arrival)
    pairs = []
    for i in range(n):
        now += rng.expovariate(8.0)
        while pending and pending[0][0] <= now:
            done, rid, prompt, arrived = pending.pop(0)
            req = make_request(request_id=rid, prompt_tokens=prompt)
            scorer.on_finish(req, "e", Outcome(200, True, ttft_s=done - arrived))
        prompt = rng.randint(500, 4000)
        ahead = max(0.0, busy_until - now) * rate
        cand = make_candidate("e", prompt_tokens=round(ahead))
        req = make_request(request_id=f"r{i}", prompt_tokens=prompt)
        score = scorer.score(req, [cand])["e"]
        scorer.committed(req, [cand], "e")
        predicted = scorer.target_s / score - scorer.target_s
        busy_until = max(busy_until, now) + prompt / rate
        pending.append((busy_until, req.request_id, prompt, now))
        pairs.append((predicted, busy_until - now))
    return pairs


def test_learns_the_prefill_rate_and_predicts_queueing() -> None:
    predictor = TtftPredictor({"e": 2_000.0}, alpha=0.1)  # prior 10x too slow
    scorer = PredictedTtftScorer(predictor, target_s=1.0)
    pairs = simulate(scorer, rate=20_000.0, n=400)
    assert predictor.rate("e") == pytest.approx(20_000.0, rel=0.02)
    late = pairs[200:]
    errors = [abs(p - a) / a for p, a in late]
    assert max(errors) < 0.05
    # the early predictions came from the prior and were far off
    assert pairs[0][0] > 5 * pairs[0][1]


def test_prior_until_learned_and_failures_teach_nothing() -> None:
    predictor = TtftPredictor({"vllm": 40_000.0, "deepinfer": 20_000.0}, default_prior=500.0)
    assert predictor.rate("vllm") == 40_000.0
    assert predictor.predict("deepinfer", 10_000, 10_000) == pytest.approx(1.0)
    req = make_request(request_id="x", prompt_tokens=4000)
    predictor.note(req, {"vllm": 0.0})
    predictor.observe(req, "vllm", Outcome(503, False, ttft_s=None))
    predictor.observe(req, "vllm", Outcome(200, True, ttft_s=0.0))
    whole = make_request(request_id="y", prompt_tokens=4000, stream=False)
    predictor.observe(whole, "vllm", Outcome(200, True, ttft_s=9.0))
    assert predictor.rate("vllm") == 40_000.0
    assert predictor.rate("new") == 500.0


Pair = tuple[float, float, float]
"""Predicted TTFT, actual TTFT, and what one FCFS queue at the true rate would predict."""


def ranked_engine(
    ranks: int, rate: float, n: int, seed: int = 3
) -> tuple[TtftPredictor, list[Pair]]:
    """Poisson arrivals on ``ranks`` data-parallel ranks, each prefilling ``rate`` tokens/s
    FCFS after a fixed 20 ms; a request joins the rank with the least prefill pending (vLLM's
    DP front end). The router sees the engine's queue as one total."""
    predictor = TtftPredictor({"e": rate}, alpha=0.1)
    rng = random.Random(seed)
    now = 0.0
    busy = [0.0] * ranks  # when each rank's prefill queue runs dry
    pending: list[tuple[float, str, int, float]] = []
    pairs = []
    for i in range(n):
        now += rng.expovariate(1.5 * ranks)  # 80% busy: the engine often has a queue
        for done in [p for p in pending if p[0] <= now]:
            pending.remove(done)
            req = make_request(request_id=done[1], prompt_tokens=done[2])
            predictor.observe(req, "e", Outcome(200, True, ttft_s=done[0] - done[3]))
        prompt = rng.randint(500, 4000)
        ahead = sum(max(0.0, b - now) for b in busy) * rate
        req = make_request(request_id=f"r{i}", prompt_tokens=prompt)
        predictor.note(req, {"e": ahead})
        k = min(range(ranks), key=lambda r: busy[r])
        busy[k] = max(busy[k], now) + 0.02 + prompt / rate
        pending.append((busy[k], req.request_id, prompt, now))
        one_queue = 0.02 + (ahead + prompt) / rate
        pairs.append((predictor.predict("e", ahead, prompt), busy[k] - now, one_queue))
    return predictor, pairs


def mape(pairs: list[Pair], column: int = 0) -> float:
    return sum(abs(p[column] - p[1]) / p[1] for p in pairs) / len(pairs)


def test_learns_how_much_of_the_queue_data_parallel_ranks_share() -> None:
    """One rank: a new request waits behind the whole queue, and the line is learned exactly.
    Eight balanced ranks: behind a fraction of it, which the predictor learns online; one
    queue at the true rate would be far off."""
    one, pairs = ranked_engine(1, 4400.0, 1500)
    assert one.share("e") == pytest.approx(1.0, abs=0.01)
    assert one.fixed_s("e") == pytest.approx(0.02, abs=0.001)
    assert one.rate("e") == pytest.approx(4400.0, rel=0.01)
    assert mape(pairs[500:]) < 0.01
    eight, pairs = ranked_engine(8, 4400.0, 1500)
    assert eight.share("e") < 0.2
    assert mape(pairs[500:]) < 0.15
    assert mape(pairs[500:], column=2) > 3 * mape(pairs[500:])


def test_share_is_learned_per_backend() -> None:
    predictor = TtftPredictor({"ranks": 4000.0, "queue": 4000.0}, alpha=0.2)
    assert predictor.share("ranks") == predictor.share("queue") == 1.0  # the prior: one queue
    rng = random.Random(5)
    for i in range(200):
        prompt, ahead = rng.randint(500, 4000), 2000.0 * (i % 3)
        for backend, waits in (("ranks", 0.0), ("queue", ahead)):
            req = make_request(request_id=f"{backend}{i}", prompt_tokens=prompt)
            predictor.note(req, {backend: ahead})
            ttft = 0.01 + (prompt + waits) / 4000.0
            predictor.observe(req, backend, Outcome(200, True, ttft_s=ttft))
    assert predictor.share("ranks") < 0.01
    assert predictor.share("queue") == pytest.approx(1.0, abs=0.001)
    for backend in ("ranks", "queue"):
        # the prior (one queue) still pulls a little: "ranks" pays for it in a fixed cost
        assert predictor.fixed_s(backend) == pytest.approx(0.01, abs=0.005)
        assert predictor.rate(backend) == pytest.approx(4000.0, rel=0.02)


def test_an_outlier_moves_the_line_little() -> None:
    predictor = TtftPredictor({"e": 4000.0}, alpha=0.1)
    for i in range(100):
        req = make_request(request_id=f"r{i}", prompt_tokens=1000 + 20 * (i % 40))
        predictor.note(req, {"e": 0.0})
        predictor.observe(req, "e", Outcome(200, True, ttft_s=0.05 + req.prompt_tokens / 4000))
    before = predictor.predict("e", 0.0, 1000)
    stall = make_request(request_id="stall", prompt_tokens=1000)
    predictor.note(stall, {"e": 0.0})
    predictor.observe(stall, "e", Outcome(200, True, ttft_s=10 * before))
    # at full weight one observation of ten times the line would move it by about 90%
    assert before <= predictor.predict("e", 0.0, 1000) < 1.1 * before


def test_pending_memory_is_bounded() -> None:
    predictor = TtftPredictor({"e": 1000.0}, pending_limit=3)
    for i in range(10):
        predictor.note(make_request(request_id=f"r{i}"), {"e": 99_000.0})
    # r0's note was dropped: its outcome is learned as if nothing was queued ahead of it, so
    # the share of the queue stays the prior's (a queue seen only in r0's note)
    predictor.observe(
        make_request(request_id="r0", prompt_tokens=1000), "e", Outcome(200, True, ttft_s=0.5)
    )
    assert predictor.share("e") == pytest.approx(1.0, abs=0.001)
    assert len(predictor._pending) == 3


@pytest.mark.parametrize(
    ("cand", "expected"),
    [
        (make_candidate("a", prompt_tokens=5000, inflight=5), 5000),  # no scrape: all open prompts
        (make_candidate("a", prompt_tokens=5000, inflight=5, waiting=2), 2000),  # 2 x mean 1000
        (make_candidate("a", prompt_tokens=0, inflight=0, waiting=3), 3 * 700),  # typical prompt
        (make_candidate("a", prompt_tokens=5000, inflight=5, waiting=2, stale=True), 5000),
        (make_candidate("a", prompt_tokens=5000, inflight=5, kv=0.5), 5000),  # no waiting figure
    ],
)
def test_queued_prefill_tokens(cand: object, expected: float) -> None:
    assert queued_prefill_tokens(cand, typical_prompt=700) == pytest.approx(expected)  # type: ignore[arg-type]


def test_tpot_tracker_follows_streamed_outcomes_only() -> None:
    tracker = TpotTracker({"vllm": 0.012}, default_prior=0.02, alpha=0.5)
    assert (tracker.tpot("vllm"), tracker.tpot("other")) == (0.012, 0.02)

    def learn(stream: bool, outcome: Outcome) -> None:
        tracker.learn(Lesson("vllm", "interactive", stream, 1000, 0.0, outcome))

    learn(True, Outcome(200, True, tpot_s=0.032))
    assert tracker.tpot("vllm") == pytest.approx(0.022)
    learn(False, Outcome(200, True, tpot_s=5.0))
    learn(True, Outcome(500, False, tpot_s=1.0))
    learn(True, Outcome(200, True, tpot_s=None))
    assert tracker.tpot("vllm") == pytest.approx(0.022)


def test_publishes_its_own_error_per_backend() -> None:
    predictor = TtftPredictor({"e": 2_000.0, "f": 1_000.0}, alpha=0.2)
    assert predictor.error() == {}
    errors = []
    for i in range(60):  # e prefills 4k tokens/s behind 1k queued; the prior says 2k
        req = make_request(request_id=f"r{i}", prompt_tokens=1000)
        predictor.note(req, {"e": 1000.0, "f": 0.0})
        predicted = predictor.predict("e", 1000.0, 1000)
        predictor.observe(req, "e", Outcome(200, True, ttft_s=0.5))
        errors.append(abs(predicted - 0.5) / 0.5)
    error = predictor.error()
    assert error.keys() == {"e"}  # f served nothing: no error to speak of
    # the mean over its observations, as predicted at decision time: the first was 100% off
    assert errors[0] == pytest.approx(1.0)
    assert error["e"] == pytest.approx(sum(errors) / len(errors))
    assert 0.01 < error["e"] < 0.2
    predictor.forget("e")
    assert predictor.error() == {}

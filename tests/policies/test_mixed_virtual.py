"""The policies in a closed feedback loop with the emulator's engine model, in virtual time.

Interactive streams arrive open loop (Poisson) while a batch job runs closed loop; the
router side (in-flight and outstanding counts, scraped waiting/KV gauges each virtual
second, on_finish with the observed TTFT/TPOT/E2E) is modelled the way the router feeds
policies. No sockets and no sleeping: this checks the policies' own feedback loop (the
benchmark over HTTP lives in benchmarks/).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from emulator.model import Engine, Sequence
from emulator.profiles import load_profile
from emulator.simulate import percentile
from policies.registry import BackendInfo, build_policy
from policies.types import Candidate, EngineLoad, Outcome, RequestClass, RequestInfo

BACKENDS = (BackendInfo("vllm", "vllm", True), BackendInfo("deepinfer", "deepinfer"))
POLICIES: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "round-robin": ("round-robin", {}),
    "class-split": (
        "class-split",
        {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]},
    ),
    "adaptive": (
        "adaptive",
        {
            "low_ttft": ["vllm"],
            "high_throughput": ["deepinfer"],
            "slo": {"interactive": {"ttft_s": 0.5, "tpot_s": 0.05}},
            "prefill_rate_prior": {"vllm": 19_000, "deepinfer": 2_900},
            "tpot_prior_s": {"vllm": 0.012, "deepinfer": 0.007},
        },
    ),
}


@dataclass
class Open:
    req: RequestInfo
    backend: str
    sent: float
    first: float | None = None


@dataclass(frozen=True)
class Figures:
    interactive_p95_ttft: float
    batch_tokens_per_s: float
    spilled: int


def run(policy_name: str, *, duration: float = 120.0, warmup: float = 20.0) -> Figures:
    kind, params = POLICIES[policy_name]
    policy = build_policy(policy_name, kind, params, BACKENDS)
    engines = {b.name: Engine(load_profile(b.engine), seed=1) for b in BACKENDS}
    rng = random.Random(1)
    counts = {name: [0, 0, 0] for name in engines}  # in-flight, prompt, output tokens
    loads: dict[str, EngineLoad | None] = dict.fromkeys(engines)
    live: dict[Sequence, Open] = {}
    ttfts: list[float] = []
    batch_tokens = spilled = 0

    def send(now: float, cls: RequestClass, n: int) -> None:
        nonlocal spilled
        prompt, out = (
            (rng.randint(500, 2000), rng.randint(100, 300))
            if cls == "interactive"
            else (rng.randint(6000, 8192), rng.randint(512, 1024))
        )
        req = RequestInfo(f"r{n}", "chat", "m", cls, cls == "interactive", prompt, out)
        cands = [
            Candidate(
                b.name, b.engine, True, *counts[b.name], None, loads[b.name], b.priority_capable
            )  # type: ignore[misc]
            for b in BACKENDS
        ]
        decision = policy.choose(req, cands)
        backend = decision.ranked[0]
        spilled += cls == "batch" and backend == "vllm"
        prio = decision.priority if decision.priority is not None and backend == "vllm" else 0
        seq = Sequence(prompt, out, priority=prio, rng=random.Random(n))
        engines[backend].submit(seq, now)
        c = counts[backend]
        c[0], c[1], c[2] = c[0] + 1, c[1] + prompt, c[2] + out
        live[seq] = Open(req, backend, now)

    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(1.0)) < duration:
        arrivals.append(t)
    n = 0
    for n in range(12):
        send(0.0, "batch", n)
    now, next_scrape = 0.0, 0.0
    while now < duration:
        due = [d for e in engines.values() if (d := e.next_deadline()) is not None]
        now = min([*due, next_scrape, *arrivals[:1]])
        if now == next_scrape:
            for name, e in engines.items():
                loads[name] = EngineLoad(e.num_waiting, e.num_running, e.kv_usage())
            next_scrape += 1.0
        if arrivals and now == arrivals[0]:
            arrivals.pop(0)
            n += 1
            send(now, "interactive", n)
        for e in engines.values():
            for seq in e.advance(now):
                rec = live[seq]
                if rec.first is None and seq.chunks:
                    rec.first = now
                seq.chunks.clear()
                if not seq.done:
                    continue
                del live[seq]
                req, c = rec.req, counts[rec.backend]
                c[0], c[1], c[2] = c[0] - 1, c[1] - req.prompt_tokens, c[2] - (req.max_tokens or 0)
                first = rec.first if rec.first is not None else now
                ttft = first - rec.sent if req.stream else now - rec.sent
                tpot = (
                    (now - first) / (seq.generated - 1)
                    if req.stream and seq.generated > 1
                    else None
                )
                outcome = Outcome(
                    200, True, req.prompt_tokens, seq.generated, ttft, now - rec.sent, tpot
                )
                policy.on_finish(req, rec.backend, outcome)
                if req.request_class == "batch":
                    if now > warmup:
                        batch_tokens += seq.generated
                    n += 1
                    send(now, "batch", n)
                elif rec.sent > warmup:
                    ttfts.append(ttft)
    return Figures(percentile(ttfts, 95), batch_tokens / (duration - warmup), spilled)


@pytest.fixture(scope="module")
def figures() -> dict[str, Figures]:
    return {name: run(name) for name in POLICIES}


def test_adaptive_keeps_interactive_fast_and_lends_idle_capacity_to_batch(
    figures: dict[str, Figures],
) -> None:
    adaptive, rr, split = figures["adaptive"], figures["round-robin"], figures["class-split"]
    assert split.spilled == 0 and adaptive.spilled > 0
    assert adaptive.interactive_p95_ttft <= 0.6 * rr.interactive_p95_ttft
    assert adaptive.interactive_p95_ttft <= 0.5  # the SLO
    assert adaptive.batch_tokens_per_s >= 1.03 * split.batch_tokens_per_s

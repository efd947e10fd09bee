"""The policies in a closed feedback loop with the emulator's engine model, in virtual time.

Interactive streams arrive open loop (Poisson; prompts 500-2,000, outputs 100-300) while a
batch job runs closed loop (12 in flight; prompts 6,000-8,192, outputs 512-1,024), on one
``vllm`` and one ``deepinfer`` engine model. The router side (in-flight and outstanding
counts, scraped waiting/KV gauges each virtual second, ``on_finish`` with the observed
TTFT/TPOT/E2E) is modelled the way the router feeds policies. No sockets, no sleeping: it
checks the policies' own feedback loop; the benchmark over HTTP lives in benchmarks/.

    .venv/bin/python -m tests.policies.virtual_mix --rate 1 --duration 300
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping
from dataclasses import dataclass

from emulator.model import Engine, Sequence
from emulator.profiles import load_profile
from emulator.simulate import percentile
from policies.registry import BackendInfo, build_policy
from policies.testing import send as routed
from policies.types import Candidate, EngineLoad, Outcome, RequestClass, RequestInfo

BACKENDS = (BackendInfo("vllm", "vllm", True), BackendInfo("deepinfer", "deepinfer"))
POLICIES: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "vllm-only": ("pinned", {"backend": "vllm"}),
    "deepinfer-only": ("pinned", {"backend": "deepinfer"}),
    "round-robin": ("round-robin", {}),
    "least-outstanding": ("least-outstanding", {"by": "tokens"}),
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
            "prefill_rate_prior": {"vllm": 4_400, "deepinfer": 2_800},
            "tpot_prior_s": {"vllm": 0.010, "deepinfer": 0.007},
        },
    ),
}


@dataclass
class RouterSide:
    """The router's own counts for one backend (what it puts in a Candidate)."""

    inflight: int = 0
    prompt: int = 0
    output: int = 0

    def add(self, prompt: int, output: int, sign: int) -> None:
        self.inflight += sign
        self.prompt += sign * prompt
        self.output += sign * output


@dataclass
class Open:
    req: RequestInfo
    backend: str
    sent: float
    first: float | None = None


SLO_TTFT_S, SLO_TPOT_S = 0.5, 0.05
Overrides = Mapping[str, Mapping[str, object]]
"""Engine kind -> profile keys to change in its shipped profile."""

# Engine pairs pinned here, so tests do not move when the shipped calibration is retuned.
_WARM = {"cold_prefills": 0}  # a cold start's first seconds are not what these runs compare
_DEEPINFER = {
    "ranks": 8,
    "rank_assignment": "random",
    "prefill_per_token_us": 355,
    "step_base_ms": 8.4,
    **_WARM,
}
# A vLLM whose single rank prefills ~19k tokens/s: lending its idle capacity to batch pays.
FAST_PREFILL_VLLM: Overrides = {
    "deepinfer": _DEEPINFER,
    "vllm": {
        "ranks": 1,
        "max_num_batched_tokens": 16384,
        "step_base_ms": 5.3,
        "step_per_prefill_token_us": 52,
        **_WARM,
    },
}
# Eight vLLM ranks prefilling ~4.4k tokens/s each (TTFT ~0.3 s at idle) beside DeepInfer's
# eight serial prefill lanes: batch runs slower on vLLM, so lending does not pay.
EIGHT_RANK_VLLM: Overrides = {
    "vllm": {
        "ranks": 8,
        "rank_assignment": "balanced",
        "max_num_batched_tokens": 8192,
        "step_base_ms": 9.8,
        "step_per_prefill_token_us": 225,
        **_WARM,
    },
    "deepinfer": _DEEPINFER,
}


@dataclass(frozen=True)
class Figures:
    interactive_p50_ttft: float
    interactive_p95_ttft: float
    interactive_slo_attainment: float
    batch_tokens_per_s: float
    spilled: int


def run(
    policy_name: str,
    *,
    rate: float = 1.0,
    duration: float = 120.0,
    warmup: float = 20.0,
    seed: int = 1,
    overrides: Overrides | None = None,
) -> Figures:
    """One run; interactive figures count requests sent after ``warmup``.

    ``overrides`` changes the shipped engine profiles (by engine kind).
    """
    kind, params = POLICIES[policy_name]
    policy = build_policy(policy_name, kind, params, BACKENDS)
    engines = {
        b.name: Engine(load_profile(b.engine, (overrides or {}).get(b.engine)), seed=seed)
        for b in BACKENDS
    }
    rng = random.Random(seed)
    router = {name: RouterSide() for name in engines}
    loads: dict[str, EngineLoad | None] = dict.fromkeys(engines)
    live: dict[Sequence, Open] = {}
    ttfts: list[float] = []
    met = 0
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
                name=b.name,
                engine=b.engine,
                inflight=router[b.name].inflight,
                outstanding_prompt_tokens=router[b.name].prompt,
                outstanding_output_tokens=router[b.name].output,
                load=loads[b.name],
                priority_capable=b.priority_capable,
            )
            for b in BACKENDS
        ]
        decision = routed(policy, req, cands)
        backend = decision.ranked[0]
        spilled += cls == "batch" and backend == "vllm"
        capable = next(b.priority_capable for b in BACKENDS if b.name == backend)
        prio = decision.priority if decision.priority is not None and capable else 0
        seq = Sequence(prompt, out, priority=prio, rng=random.Random(n))
        engines[backend].submit(seq, now)
        router[backend].add(prompt, out, +1)
        live[seq] = Open(req, backend, now)

    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < duration:
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
                req = rec.req
                router[rec.backend].add(req.prompt_tokens, req.expected_output_tokens, -1)
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
                    met += ttft <= SLO_TTFT_S and (tpot is None or tpot <= SLO_TPOT_S)
    return Figures(
        percentile(ttfts, 50),
        percentile(ttfts, 95),
        met / len(ttfts) if ttfts else 0.0,
        batch_tokens / (duration - warmup),
        spilled,
    )


def main() -> None:
    """Print every policy's figures and adaptive's ratios to round-robin and class-split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1.0, help="interactive requests/s")
    parser.add_argument("--duration", type=float, default=300.0, help="virtual seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fast-prefill-vllm",
        action="store_true",
        help="one vLLM rank prefilling ~19k tokens/s instead of the shipped profile",
    )
    args = parser.parse_args()
    overrides = FAST_PREFILL_VLLM if args.fast_prefill_vllm else None
    figures = {}
    engines = "fast-prefill vllm" if overrides else "shipped profiles"
    print(f"interactive {args.rate}/s + batch x12 closed loop, {args.duration:.0f} s, {engines}")
    heads = ("i-P50 s", "i-P95 s", "SLO att", "batch tok/s", "spilled")
    print(f"{'policy':18} " + " ".join(f"{h:>11}" for h in heads))
    for name in POLICIES:
        f = figures[name] = run(
            name, rate=args.rate, duration=args.duration, seed=args.seed, overrides=overrides
        )
        print(
            f"{name:18} {f.interactive_p50_ttft:11.3f} {f.interactive_p95_ttft:11.3f} "
            f"{f.interactive_slo_attainment:11.2f} {f.batch_tokens_per_s:11.0f} {f.spilled:11d}"
        )
    a, rr, cs = figures["adaptive"], figures["round-robin"], figures["class-split"]
    p95_ratio = a.interactive_p95_ttft / rr.interactive_p95_ttft
    batch_ratio = a.batch_tokens_per_s / cs.batch_tokens_per_s
    print(f"adaptive/round-robin interactive P95: {p95_ratio:.2f}")
    print(f"adaptive/class-split batch throughput: {batch_ratio:.3f}")


if __name__ == "__main__":
    main()

"""Closed-loop benchmark of the engine model in virtual time (no HTTP, no sleeping).

The same shape as the public run's client: ``concurrency`` requests in flight, each new one
sent the moment another finishes, fixed prompt and forced output lengths. Figures use the key
names and definitions of vLLM's serving benchmark (TTFT to the first content chunk, ITL the
gaps between content chunks, output throughput over the whole run). Used by the unit tests and
to fit a profile to a benchmark run before confirming it over HTTP.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from emulator.model import Engine, Sequence
from emulator.profiles import Profile


@dataclass(slots=True)
class RequestTimes:
    """When one request was sent, got each chunk, and how many tokens it produced."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1] - self.sent

    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default), ``q`` in [0, 100]."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def figures(
    ttfts: list[float], itls: list[float], e2es: list[float], tokens: int, duration: float
) -> dict[str, float]:
    """vLLM-benchmark figures (ms for latencies) from per-request measurements in seconds."""
    return {
        "completed": float(len(ttfts)),
        "duration": duration,
        "output_throughput": tokens / duration if duration else 0.0,
        "mean_ttft_ms": 1e3 * sum(ttfts) / len(ttfts),
        "median_ttft_ms": 1e3 * percentile(ttfts, 50),
        "p95_ttft_ms": 1e3 * percentile(ttfts, 95),
        "mean_itl_ms": 1e3 * sum(itls) / len(itls) if itls else 0.0,
        "mean_e2el_ms": 1e3 * sum(e2es) / len(e2es),
        "p95_e2el_ms": 1e3 * percentile(e2es, 95),
    }


def summarize(requests: list[RequestTimes], duration: float) -> dict[str, float]:
    """:func:`figures` of the requests that produced at least one chunk."""
    done = [r for r in requests if r.chunk_times]
    itls = [g for r in done for g in r.itls()]
    tokens = sum(r.tokens for r in done)
    return figures([r.ttft for r in done], itls, [r.e2e for r in done], tokens, duration)


def closed_loop(
    profile: Profile,
    *,
    requests: int = 100,
    concurrency: int = 16,
    prompt_tokens: int = 8192,
    output_tokens: int = 1024,
    seed: int = 0,
    client_delay: float = 0.002,
    delay_jitter: float = 0.0,
) -> tuple[dict[str, float], list[RequestTimes]]:
    """Run the benchmark shape in virtual time; return the figures and per-request times.

    ``client_delay`` (model seconds) separates a response's end from the next request's
    arrival, and the first wave's arrivals from each other, as a real client over loopback
    does. It matters: a request that arrives exactly at a step boundary joins that step,
    while one that arrives a moment later waits for the whole step (in mixed scheduling, a
    prefill step can last hundreds of milliseconds).
    """
    engine = Engine(profile, seed=seed)
    rng = random.Random(seed)
    times: dict[Sequence, RequestTimes] = {}
    log: list[RequestTimes] = []
    arrivals = deque(i * client_delay for i in range(min(concurrency, requests)))

    def send(now: float) -> None:
        seq = Sequence(prompt_tokens, output_tokens, rng=random.Random(rng.getrandbits(64)))
        rec = RequestTimes(sent=now)
        times[seq] = rec
        log.append(rec)
        engine.submit(seq, now)

    now = 0.0
    while True:
        deadline = engine.next_deadline()
        if arrivals and (deadline is None or arrivals[0] <= deadline):
            now = arrivals.popleft()
            send(now)
            continue
        if deadline is None:
            break
        now = deadline
        for seq in engine.advance(now):
            rec = times[seq]
            rec.chunk_times.extend([now] * len(seq.chunks))
            rec.tokens = seq.generated
            seq.chunks.clear()
            if seq.done and len(log) + len(arrivals) < requests:
                arrivals.append(now + client_delay + delay_jitter * rng.random())
    return summarize(log, now), log

"""Writes config/demo-capture.jsonl, the bundled capture `make demo` replays (deterministic).

Four minutes of synthetic mixed traffic in the capture schema, as a router with
``redaction: drop`` would have written it (prompt text removed, sizes kept in
``resp.usage.prompt_tokens``; the replayer synthesizes prompts of those sizes):

* interactive chat: streamed, 300 to 3,000 prompt tokens, 64 to 384 output tokens, Poisson
  arrivals whose rate swells to about three times its base in two surges;
* batch jobs: non-streamed, ``service_tier: flex``, 2,000 to 12,000 prompt tokens, 512 to
  1,024 output tokens, submitted in clumps of 4 to 10 a few times a minute.

    .venv/bin/python -m benchmarks.replay_make_demo [-o config/demo-capture.jsonl]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

from turnout.common.capture import CaptureRecord, Response, Route, dump_line, iso_utc

MODEL = "deepseek-v4.1-flash"
URL = "/v1/chat/completions"
DURATION_S = 240.0
START_WALL = 1_777_636_800.0  # 2026-05-01T12:00:00Z, a fixed, made-up capture start


def _interactive(rng: random.Random) -> list[tuple[float, dict[str, object], int, int]]:
    out: list[tuple[float, dict[str, object], int, int]] = []
    t = 0.0
    while True:
        # base 0.5/s; two surges (around 1 and 3 minutes) up to about 1.5/s
        rate = 0.5 * (1 + 2 * math.sin(math.pi * t / 120.0) ** 8)
        t += rng.expovariate(rate)
        if t >= DURATION_S:
            return out
        max_tokens = rng.randint(64, 384)
        body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "temperature": 0.7}
        out.append((t, body, rng.randint(300, 3000), max_tokens))


def _batch(rng: random.Random) -> list[tuple[float, dict[str, object], int, int]]:
    out: list[tuple[float, dict[str, object], int, int]] = []
    t = rng.uniform(5, 20)
    while t < DURATION_S:
        for _ in range(rng.randint(4, 10)):
            at = t + rng.uniform(0, 0.5)
            max_tokens = rng.randint(512, 1024)
            body = {"model": MODEL, "max_tokens": max_tokens, "service_tier": "flex"}
            out.append((at, body, rng.randint(2000, 12000), max_tokens))
        t += rng.uniform(15, 35)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", type=Path, default=Path("config/demo-capture.jsonl"))
    p.add_argument("--seed", type=int, default=2026)
    a = p.parse_args()
    rng = random.Random(a.seed)
    rows = sorted(_interactive(rng) + _batch(rng), key=lambda r: r[0])
    with a.output.open("wb") as f:
        for n, (t, body, prompt, max_tokens) in enumerate(rows):
            cls = "batch" if "service_tier" in body else "interactive"
            rec = CaptureRecord(
                custom_id=f"demo-{n:04d}",
                url=URL,
                body=body,
                t_offset_ms=t * 1000.0,
                ts=iso_utc(START_WALL + t),
                headers={"user-agent": "demo-client/1.0"},
                route=Route(policy="adaptive", request_class=cls),
                resp=Response(
                    status=200,
                    stream=cls == "interactive",
                    prompt_tokens=prompt,
                    completion_tokens=max_tokens,
                ),
            )
            f.write(dump_line(rec))
    batch = sum(1 for r in rows if "service_tier" in r[1])
    print(f"wrote {len(rows)} requests ({batch} batch) over {DURATION_S:.0f} s to {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Over real HTTP, an independent closed-loop client reproduces the public run's figures.

The client is written here with the official ``openai`` client (not the project's replay or
SSE code): 100 streamed completions of 8,192 prompt tokens and 1,024 forced output tokens at
concurrency 16, a new request the moment one finishes; every figure is taken over all 100
(TTFT over half of them scattered by 3 to 5% from the sampling alone). The emulator runs at
time scale 2.5; times are multiplied back by it. A run whose processes were starved of CPU
(:data:`MAX_WAITING`) is not a measurement and is skipped.

Both profiles run at once, each in its own emulator process (about 40 s; one after the other
took 70 s). That doubles the chunks reaching this one client process (about 5,600/s), so a
streamed answer is read as raw SSE lines through the client's streaming response and only its
``data:`` payloads are decoded, instead of building one typed chunk object per token: that
halves the client's CPU (measured): the client uses about 18 s of CPU in a 40 s run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from pathlib import Path

import openai
import pytest

from tests.procs import start_emulator

SCALE = 2.5
MODEL = "deepseek-v4.1-flash"
# Built before the clock starts, so the first wave reaches the engine together.
PROMPTS = [f"q{i} " + " ".join(["lorem"] * 8191) for i in range(100)]  # 8,192 tokens each
# Wall-clock figures: `make test` runs this module after the parallel suite, not beside it.
pytestmark = pytest.mark.alone
MAX_WAITING = 1.0
"""Seconds per second of the run that the client and the two emulators together may have
waited for a CPU, for the run to count as a measurement. The emulator keeps its steps on an
absolute clock, so a loaded machine moves the figures little until its processes are
starved: measured on 2 cores, 0.08 quiet (every ratio within 5% but deepinfer's e2e, 0.86),
1.28 beside 3 busy loops (no ratio moved more than 3%), 1.93 beside 8 (vllm's mean TTFT
1.9x the published, throughput 0.80x: a failure that says nothing about the emulator).
Over it the figures are not checked (skipped, saying how starved the run was)."""
PUBLISHED = {  # GPUStack's 8x B200 run
    "vllm": {"tput": 1112.20, "ttft": 2.04, "p95_ttft": 8.27, "itl": 0.01198, "e2e": 14.30},
    "deepinfer": {"tput": 1392.44, "ttft": 4.28, "p95_ttft": 16.33, "itl": 0.00874, "e2e": 13.23},
}


def _p95(values: list[float]) -> float:
    s = sorted(values)
    pos = 0.95 * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


async def _one(client: openai.AsyncOpenAI, i: int) -> tuple[float, list[float], int]:
    """Stream request ``i``; return (start, content-chunk arrival times, tokens)."""
    start = time.perf_counter()
    times: list[float] = []
    tokens = 0
    async with client.completions.with_streaming_response.create(
        model=MODEL, prompt=PROMPTS[i], max_tokens=1024, extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:  # fmt: skip
        async for line in raw.iter_lines():
            if not line.startswith("data: {"):
                continue  # blank lines between events, and the closing [DONE]
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return start, times, tokens


async def _run(url: str) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    todo = iter(range(100))
    results: list[tuple[float, list[float], int]] = []

    async def worker() -> None:
        for i in todo:
            results.append(await _one(client, i))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(16)))
    duration = time.perf_counter() - t0
    await client.close()
    ttfts = [t[0] - s for s, t, _ in results]
    gaps = [b - a for _, t, _ in results for a, b in itertools.pairwise(t)]
    return {
        "tput": sum(n for *_, n in results) / (duration * SCALE),
        "ttft": SCALE * sum(ttfts) / len(ttfts),
        "p95_ttft": SCALE * _p95(ttfts),
        "itl": SCALE * sum(gaps) / len(gaps),
        "e2e": SCALE * sum(t[-1] - s for s, t, _ in results) / len(results),
        "tokens": float(sum(n for *_, n in results)),
    }


def _runnable_waiting(pids: list[int]) -> float:
    """Seconds the threads of ``pids`` have spent ready to run but waiting for a CPU (the
    kernel's ``/proc/PID/task/TID/schedstat``), summed."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, float]]:
    with (
        start_emulator("vllm", time_scale=SCALE) as vllm,
        start_emulator("deepinfer", time_scale=SCALE) as deepinfer,
    ):

        async def both() -> tuple[dict[str, float], dict[str, float]]:
            return await asyncio.gather(_run(vllm.url), _run(deepinfer.url))

        pids = [os.getpid(), vllm.proc.pid, deepinfer.proc.pid]
        waited, start = _runnable_waiting(pids), time.perf_counter()
        got = asyncio.run(both())
        waited = _runnable_waiting(pids) - waited
        wall = time.perf_counter() - start
    if waited / wall > MAX_WAITING:
        pytest.skip(
            f"too loaded to measure: the client and the emulators waited for a CPU "
            f"{waited / wall:.2f} s per second of the run (a measurement allows {MAX_WAITING})"
        )
    return dict(zip(("vllm", "deepinfer"), got, strict=True))


@pytest.mark.parametrize("name", ["vllm", "deepinfer"])
def test_published_figures_within_tolerance(
    name: str, measured: dict[str, dict[str, float]]
) -> None:
    got, pub = measured[name], PUBLISHED[name]
    ratios = {k: got[k] / pub[k] for k in ("tput", "ttft", "p95_ttft", "itl", "e2e")}
    assert got["tokens"] == 100 * 1024
    for key in ("tput", "ttft", "itl"):
        assert abs(ratios[key] - 1) <= 0.10, ratios
    assert abs(ratios["p95_ttft"] - 1) <= 0.15, ratios
    assert abs(ratios["e2e"] - 1) <= 0.20, ratios


def test_deepinfer_has_the_heavier_ttft_tail(measured: dict[str, dict[str, float]]) -> None:
    assert measured["deepinfer"]["p95_ttft"] >= 1.2 * measured["vllm"]["p95_ttft"]

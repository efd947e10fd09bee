"""A router of one worker and of two, side by side: what /metrics says, and how long a drain takes.

For each worker count it starts one emulator and the router (real processes, loopback), then

- sends ``--requests`` chat requests from ``--concurrency`` clients, each over a fresh
  connection so the kernel spreads them over the workers, while a scraper reads /metrics
  (also a fresh connection each time) every 250 ms; then ``--scrapes`` more scrapes once the
  load is done. It prints the request rate, the scrape time, whether
  ``turnout_requests_total`` ever went backwards, and the last scrapes' totals against the
  number of requests answered;
- opens one long stream, sends SIGTERM with ``shutdown.drain_seconds`` = ``--drain``, and
  prints when the stream got its error event and when the router exited.

Last it times what one request's metrics cost in this process (``Metrics.request_done``),
kept in memory as with one worker, and in prometheus-client's multiprocess files as with
several.

    python -m benchmarks.workers [--requests 400] [--concurrency 16] [--drain 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop
import yaml

from router.observe.metrics import Metrics
from router.observe.sharing import share_between_workers
from router.server.children import spawn_ready, stop_all

MODEL = "deepseek-v4.1-flash"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@dataclass
class Figures:
    workers: int
    rate: float = 0.0
    scrape_ms: float = 0.0
    backwards: int = 0
    sent: int = 0
    last: list[float] | None = None
    cut_s: float = 0.0
    exit_s: float = 0.0
    event: str = ""


def _total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("turnout_requests_total{")
    )


async def _load(url: str, requests: int, concurrency: int, scrapes: int, out: Figures) -> None:
    # force_close: one connection per request, as a fleet of clients would open.
    conn = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        seen: list[float] = []
        times: list[float] = []
        done = asyncio.Event()

        async def scrape() -> None:
            t0 = time.perf_counter()
            async with session.get(url + "/metrics") as r:
                seen.append(_total(await r.text()))
            times.append(time.perf_counter() - t0)

        async def scraper() -> None:
            while not done.is_set():
                await scrape()
                await asyncio.sleep(0.25)

        left = iter(range(requests))

        async def client() -> None:
            for _ in left:
                async with session.post(url + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()
                    out.sent += r.status == 200

        task = asyncio.create_task(scraper())
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        out.rate = requests / (time.perf_counter() - t0)
        done.set()
        await task
        for _ in range(scrapes):
            await scrape()
        out.backwards = sum(b < a for a, b in itertools.pairwise(seen))
        out.last = seen[-scrapes:]
        out.scrape_ms = statistics.median(times) * 1000


async def _drain(url: str, router_proc: subprocess.Popen[bytes], out: Figures) -> None:
    body = {**CHAT, "max_tokens": 3000, "min_tokens": 3000, "ignore_eos": True, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as r,
    ):
        await r.content.readline()  # the first event: the stream is open
        t0 = time.monotonic()
        router_proc.send_signal(signal.SIGTERM)
        async for line in r.content:
            if line.startswith(b'data: {"error"'):
                out.event = json.loads(line[6:])["error"]["code"]
            if line.startswith(b"data: [DONE]"):
                out.cut_s = time.monotonic() - t0
        await asyncio.to_thread(router_proc.wait)
        out.exit_s = time.monotonic() - t0


def _run(workers: int, args: argparse.Namespace, tmp: Path) -> Figures:
    out = Figures(workers)
    emu_argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port", "0",
                "--time-scale", "4"]  # fmt: skip
    emu, emu_url = spawn_ready(emu_argv, "emulator listening on ", 30.0)
    procs = [emu]
    try:
        doc = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "backends": [{"name": "vllm", "engine": "vllm", "url": emu_url}],
            "policies": {"rr": {"type": "round-robin"}},
            "default_policy": "rr",
            "shutdown": {"drain_seconds": args.drain},
        }
        path = tmp / f"router-{workers}.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path),
                "--workers", str(workers)]  # fmt: skip
        router, url = spawn_ready(argv, "turnout listening on ", 30.0)
        procs.append(router)
        uvloop.run(_load(url, args.requests, args.concurrency, args.scrapes, out))
        uvloop.run(_drain(url, router, out))
    finally:
        stop_all(procs)
    return out


def _record_cost(metrics: Metrics, n: int = 20000) -> float:
    """Microseconds per ``request_done`` of a served request (two label sets, alternating)."""
    t0 = time.perf_counter()
    for i in range(n):
        metrics.request_done("rr", "vllm", ("interactive", "batch")[i & 1], 200, "ok",
                             ttft=0.05, tpot=0.01, e2e=1.0, prompt_tokens=100,
                             output_tokens=200)  # fmt: skip
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--scrapes", type=int, default=30)
    p.add_argument("--drain", type=float, default=3.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [_run(n, args, Path(tmp)) for n in (1, 2)]
        in_memory = _record_cost(Metrics())
        share_between_workers(Path(tmp))  # this process only, from here on
        in_files = _record_cost(Metrics(workers_dir=Path(tmp)))
    print(f"{'workers':>8} {'req/s':>7} {'scrape ms':>9} {'backwards':>9} {'answered':>8} "
          f"{'last scrapes':>14} {'drain':>5} {'cut s':>6} {'exit s':>6} event")  # fmt: skip
    for f in rows:
        last = f.last or [0.0]
        span = f"{min(last):g}..{max(last):g}"
        drain = f"{args.drain:>5g} {f.cut_s:>6.2f} {f.exit_s:>6.2f} {f.event}"
        print(f"{f.workers:>8} {f.rate:>7.0f} {f.scrape_ms:>9.1f} {f.backwards:>9} {f.sent:>8} "
              f"{span:>14} {drain}")  # fmt: skip
    print(f"metrics of one request: {in_memory:.1f} us in memory (one worker), "
          f"{in_files:.1f} us in multiprocess files (workers)")  # fmt: skip


if __name__ == "__main__":
    main()

"""Chaos through one router: sustained mixed load while backends die, stall, break and refuse.

    python -m benchmarks.chaos [--duration 60] [--concurrency 24] [--backends 3] [--phase 4]

Starts ``--backends`` emulators and one router (round-robin over all of them, fast health
probes). Closed-loop clients send a mix of streamed chat, non-streamed chat and streamed
completions. Every ``--phase`` seconds one backend in turn (never two at once, so a healthy
one always remains) is put into one fault, then brought back; every fault is played at
least once, then more until ``--duration`` is up:

- ``kill``: SIGKILL, down for the phase, restarted on the same port;
- ``stall``: restarted answering only after 5 s (beyond the router's first-byte timeout);
- ``drop``: restarted aborting every stream after 3 tokens (mid-stream failures);
- ``503`` / ``429``: restarted answering every request with that status.

Printed: requests sent, succeeded, failed before the first byte (must be 0: a healthy
backend always remains), failed mid-stream (each must have ended with an SSE error event;
streams that broke without one are counted apart), the router's failovers (its
``turnout_failovers_total``) and the router's RSS at start and end (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import uvloop
import yaml

from router.server.children import spawn_ready

MODEL = "chaos-model"
FAULTS: dict[str, list[str]] = {
    "kill": [],
    "stall": ["--stall", "5"],
    "drop": ["--drop-after", "3"],
    "503": ["--error-rate", "1", "--error-status", "503"],
    "429": ["--error-rate", "1", "--error-status", "429"],
}
_ERROR_EVENT = b'data: {"error"'


@dataclass
class Figures:
    """What the load saw, plus the router's own counts."""

    sent: int = 0
    succeeded: int = 0
    failed_before_first_byte: int = 0
    failed_mid_stream: int = 0
    broken_without_error_event: int = 0
    failovers: int = 0
    rss_start_kb: int = 0
    rss_end_kb: int = 0
    faults: list[str] = field(default_factory=list)
    first_byte_errors: dict[str, int] = field(default_factory=dict)


class Backend:
    """One emulator process on a port that survives restarts."""

    def __init__(self, name: str, time_scale: float) -> None:
        self.name = name
        self.time_scale = time_scale
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, extra: list[str]) -> None:
        argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm",
                "--port", str(self.port), "--model", MODEL,
                "--time-scale", str(self.time_scale), *extra]  # fmt: skip
        self.proc, url = spawn_ready(argv, "emulator listening on ", 30.0)
        self.port = int(url.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def router_config(backends: list[Backend]) -> dict[str, object]:
    names = [b.name for b in backends]
    # Beyond a loaded machine's worst first byte, well below the 5 s stall.
    quick = {"connect": 0.5, "first_byte": 2.0, "idle": 3.0, "total": 30}
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [
            {"name": b.name, "engine": "vllm", "url": b.url, "models": [MODEL]} for b in backends
        ],
        "default_policy": "round-robin",
        "policies": {"round-robin": {"type": "round-robin", "params": {"backends": names}}},
        "timeouts": {"interactive": quick, "batch": quick},
        "failover": {"max_attempts": len(backends), "backoff_initial": 0.001, "backoff_max": 0.01},
        "health": {
            "interval": 0.2,
            "timeout": 0.5,
            "failures_to_eject": 2,
            "cooldown": 0.5,
            "cooldown_max": 2.0,
            "scrape_metrics": False,
        },
    }


@contextlib.contextmanager
def started(backends: list[Backend], config_dir: Path) -> Iterator[tuple[str, int]]:
    """Emulators and a router; yields the router's URL and pid; everything killed after."""
    router: subprocess.Popen[bytes] | None = None
    try:
        for b in backends:
            b.start([])
        path = config_dir / "chaos.yaml"
        path.write_text(yaml.safe_dump(router_config(backends)), encoding="utf-8")
        argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path), "--port", "0"]
        router, url = spawn_ready(argv, "turnout listening on ", 30.0)
        yield url, router.pid
    finally:
        if router is not None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(10)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
            if router.stdout is not None:
                router.stdout.close()
        for b in backends:
            b.kill()


def _request(i: int) -> tuple[str, dict[str, object], bool]:
    kind = i % 3
    if kind == 0:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"chaos {i}"}],
                "max_tokens": 24, "stream": True}  # fmt: skip
        return "/v1/chat/completions", body, True
    if kind == 1:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"whole {i}"}],
                "max_tokens": 8}  # fmt: skip
        return "/v1/chat/completions", body, False
    body = {"model": MODEL, "prompt": f"complete {i}", "max_tokens": 16, "stream": True}
    return "/v1/completions", body, True


async def _one(session: aiohttp.ClientSession, url: str, i: int, fig: Figures) -> None:
    path, body, stream = _request(i)
    fig.sent += 1
    got_bytes = False
    tail = b""
    try:
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                fig.failed_before_first_byte += 1
                key = f"status {resp.status}"
                fig.first_byte_errors[key] = fig.first_byte_errors.get(key, 0) + 1
                await resp.read()
                return
            if not stream:
                await resp.read()
                fig.succeeded += 1
                return
            async for chunk in resp.content.iter_any():
                got_bytes = True
                tail = (tail + chunk)[-4096:]
    except (aiohttp.ClientError, TimeoutError) as exc:
        if not got_bytes:
            fig.failed_before_first_byte += 1
            key = exc.__class__.__name__
            fig.first_byte_errors[key] = fig.first_byte_errors.get(key, 0) + 1
        else:
            fig.broken_without_error_event += 1
        return
    if _ERROR_EVENT in tail:
        fig.failed_mid_stream += 1
    elif tail.endswith(b"data: [DONE]\n\n"):
        fig.succeeded += 1
    else:
        fig.broken_without_error_event += 1


async def _clients(url: str, concurrency: int, done: asyncio.Event, fig: Figures) -> None:
    counter = itertools.count()
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def loop() -> None:
            while not done.is_set():
                await _one(session, url, next(counter), fig)

        await asyncio.gather(*(loop() for _ in range(concurrency)))


async def _chaos(
    backends: list[Backend], phase: float, until: float, fig: Figures, done: asyncio.Event
) -> None:
    """One backend at a time: fault for a phase, healthy for a phase. Every fault kind is
    played at least once, however long that takes (restarts are slow on a loaded machine);
    then more rounds while ``until`` allows."""
    kinds = itertools.cycle(FAULTS)
    try:
        for b in itertools.cycle(backends):
            if len(fig.faults) >= len(FAULTS) and time.monotonic() + 2 * phase > until:
                return
            kind = next(kinds)
            fig.faults.append(f"{b.name}:{kind}")
            b.kill()
            if kind != "kill":
                await asyncio.to_thread(b.start, FAULTS[kind])
            await asyncio.sleep(phase)
            b.kill()
            await asyncio.to_thread(b.start, [])
            await asyncio.sleep(phase)
    finally:
        done.set()


async def _failovers(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        text = await resp.text()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("turnout_failovers_total{")
        )
    )


async def run(
    duration: float, concurrency: int, n_backends: int, phase: float, time_scale: float = 20.0
) -> Figures:
    """Run the whole scenario and return its figures."""
    fig = Figures()
    backends = [Backend(f"b{i}", time_scale) for i in range(n_backends)]
    with tempfile.TemporaryDirectory() as tmp, started(backends, Path(tmp)) as (url, pid):
        fig.rss_start_kb = rss_kb(pid)
        until = time.monotonic() + duration
        done = asyncio.Event()
        await asyncio.gather(
            _clients(url, concurrency, done, fig), _chaos(backends, phase, until, fig, done)
        )
        fig.failovers = await _failovers(url)
        fig.rss_end_kb = rss_kb(pid)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--backends", type=int, default=3)
    p.add_argument("--phase", type=float, default=4.0)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    a = p.parse_args()
    if a.backends < 2:
        p.error("--backends must be at least 2 (one must stay healthy)")
    t0 = time.monotonic()
    fig = uvloop.run(run(a.duration, a.concurrency, a.backends, a.phase))
    if a.json:
        print(json.dumps(asdict(fig)), flush=True)
        return
    print(f"duration                      {time.monotonic() - t0:.1f} s")
    print(f"faults injected               {len(fig.faults)}: {' '.join(fig.faults)}")
    print(f"requests sent                 {fig.sent}")
    print(f"succeeded                     {fig.succeeded}")
    print(f"failed before first byte      {fig.failed_before_first_byte} {fig.first_byte_errors}")
    print(f"failed mid-stream (SSE error) {fig.failed_mid_stream}")
    print(f"broken without error event    {fig.broken_without_error_event}")
    print(f"router failovers              {fig.failovers}")
    start, end = fig.rss_start_kb / 1024, fig.rss_end_kb / 1024
    print(f"router RSS start / end        {start:.1f} / {end:.1f} MiB")


if __name__ == "__main__":
    main()

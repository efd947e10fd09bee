"""What the router adds to a stream: the same load sent directly and through one router worker.

    python -m benchmarks.proxy_overhead [--chunks 64] [--streams 512] [--concurrency 1,64,256]

A tiny SSE upstream (raw asyncio protocol on uvloop, its own process) answers every chat
request with ``--chunks`` events, each its own write; paced runs send one every 5 ms on an
absolute schedule like an engine's step clock, unpaced runs write them back to back. The
load generator (this process) keeps ``concurrency`` streams open, starting them staggered
over one paced stream's length so that requests arrive spread out as in steady serving
rather than all at once, and measures per stream TTFT (request sent -> first event) and
E2E (-> end of stream). For each mode and concurrency it prints the added TTFT and E2E
(router percentile minus direct percentile), the router's CPU seconds per 1,000 forwarded
chunks (utime+stime from /proc), the chunks/s the router forwarded, and 1,000 / (CPU s per
1,000 chunks): what one fully busy router core would forward. Direct and routed runs
alternate for ``--rounds`` rounds and medians are printed, so a burst of other load on the
machine hits both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import aiohttp
import uvloop
import yaml

from router.server.children import spawn_ready

UPSTREAM_READY = "upstream listening on "
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
_GAP = re.compile(rb"x-bench-gap-ms:\s*([0-9.]+)", re.IGNORECASE)
_CHUNKS = re.compile(rb"x-bench-chunks:\s*(\d+)", re.IGNORECASE)
_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d}}\n\n'
# A non-streamed request's answer: one message, with its usage.
_ANSWER = (
    b'{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":" tok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,'
    b'"completion_tokens":%d}}'
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Upstream(asyncio.Protocol):
    """HTTP/1.1 keep-alive SSE server; one request at a time per connection."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self._buf[:end]
        m = _CONTENT_LENGTH.search(head)
        length = int(m.group(1)) if m else 0
        if len(self._buf) < end + 4 + length:
            return
        body = self._buf[end + 4 : end + 4 + length]
        self._buf = self._buf[end + 4 + length :]
        path = head.split(b" ", 2)[1]
        if path.startswith(b"/v1/chat") and b'"stream":false' in body:
            tokens = _CHUNKS.search(head)
            doc = _ANSWER % (int(tokens.group(1)) if tokens else 1)
            self._write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc)
            )
        elif path.startswith(b"/v1/chat"):
            gap = _GAP.search(head)
            chunks = _CHUNKS.search(head)
            asyncio.get_running_loop().create_task(
                self._stream(
                    float(gap.group(1)) / 1000 if gap else 0.0,
                    int(chunks.group(1)) if chunks else 64,
                    b'"include_usage":true' in body,
                )
            )
        else:
            doc = b'{"object":"list","data":[]}' if path == b"/v1/models" else b"{}"
            self._write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc)
            )

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    async def _stream(self, gap: float, chunks: int, usage: bool) -> None:
        self._write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        event = _chunk(_EVENT)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(chunks):
            if gap and i:
                # An absolute schedule, like an engine's step clock: a late wake-up (the
                # machine is shared with the router) does not push every later chunk back.
                await asyncio.sleep(max(0.0, start + i * gap - loop.time()))
            self._write(event)
        if usage:
            self._write(_chunk(_USAGE % chunks))
        self._write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def _serve_upstream() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Upstream, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"{UPSTREAM_READY}http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


@dataclass(frozen=True)
class RunResult:
    ttft: list[float]
    e2e: list[float]
    chunks: int
    wall: float


async def _load(
    url: str,
    concurrency: int,
    streams: int,
    chunks: int,
    gap_ms: float,
    burst: bool = False,
    stream: bool = True,
    auth: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> RunResult:
    """``streams`` requests, ``concurrency`` at a time; ``stream=False``: each answered by
    one JSON body (counted as one chunk); ``auth``: an API key to send; ``headers``: more
    request headers."""
    body = (
        b'{"model":"bench","messages":[{"role":"user","content":"hello"}],"stream":%s,'
        b'"max_tokens":%d}' % (b"true" if stream else b"false", chunks)
    )
    headers = {
        "Content-Type": "application/json",
        "X-Bench-Gap-Ms": str(gap_ms),
        "X-Bench-Chunks": str(chunks),
        **({"Authorization": f"Bearer {auth}"} if auth is not None else {}),
        **(headers or {}),
    }
    ttft: list[float] = []
    e2e: list[float] = []
    total = 0
    per_worker = max(1, streams // concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(i: int) -> None:
            nonlocal total
            # Paced streams all last chunks x gap: started together they would also end
            # together, and every request would arrive in a burst of `concurrency` at once.
            # Staggered over one stream's length, arrivals spread out as in steady serving.
            if not burst:
                await asyncio.sleep(i * chunks * gap_ms / 1000 / concurrency)
            for _ in range(per_worker):
                t0 = time.perf_counter()
                first = None
                async with session.post(url, data=body, headers=headers) as resp:
                    async for data in resp.content.iter_any():
                        if first is None:
                            first = time.perf_counter()
                        total += data.count(b"data:") if stream else 0
                total += 0 if stream else 1
                end = time.perf_counter()
                ttft.append((first or end) - t0)
                e2e.append(end - t0)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - start
    return RunResult(ttft, e2e, total, wall)


def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``'s threads: nanoseconds from schedstat where the kernel keeps it
    (clock ticks, 10 ms apiece, are too coarse for a fraction of a second of work)."""
    try:
        return (
            sum(
                int((task / "schedstat").read_text().split()[0])
                for task in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (OSError, ValueError, IndexError):  # no schedstat, or a thread just ended
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _router_config(upstream: str, directory: Path, access_log: bool) -> Path:
    doc = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [
            {
                "name": "fast",
                "engine": "vllm",
                "url": upstream,
                "models": ["bench"],
                # The bench upstream's pacing knobs: engines get only allow-listed headers.
                "forward_headers": ["X-Bench-Gap-Ms", "X-Bench-Chunks"],
            }
        ],
        "default_policy": "pinned",
        "policies": {"pinned": {"type": "pinned", "params": {"backend": "fast"}}},
        "health": {"interval": 5.0, "scrape_metrics": False},
        "access_log": {"enabled": access_log},
    }
    path = directory / "bench-router.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass(frozen=True)
class Row:
    """One round's figures for a mode and concurrency (seconds, except where named)."""

    ttft50: float
    ttft99: float
    e2e50: float
    e2e99: float
    cpu_per_1k: float
    chunks_per_s: float


def _round(upstream: str, router: str, pid: int, conc: int, streams: int, chunks: int,
           gap: float, burst: bool) -> Row:  # fmt: skip
    """Direct then through the router, same load; the router's CPU only for its run."""
    path = "/v1/chat/completions"
    direct = uvloop.run(_load(upstream + path, conc, streams, chunks, gap, burst))
    cpu0 = _cpu_seconds(pid)
    via = uvloop.run(_load(router + path, conc, streams, chunks, gap, burst))
    cpu = _cpu_seconds(pid) - cpu0
    return Row(
        ttft50=_pct(via.ttft, 50) - _pct(direct.ttft, 50),
        ttft99=_pct(via.ttft, 99) - _pct(direct.ttft, 99),
        e2e50=_pct(via.e2e, 50) - _pct(direct.e2e, 50),
        e2e99=_pct(via.e2e, 99) - _pct(direct.e2e, 99),
        cpu_per_1k=cpu / max(via.chunks, 1) * 1000,
        chunks_per_s=via.chunks / via.wall,
    )


def _print_targets(medians: dict[tuple[str, int], Row]) -> None:
    """The router issue's targets for one worker, against this run's medians."""
    checks: list[tuple[str, float, float, str]] = []
    paced = medians.get(("paced", 64))
    if paced is not None:
        checks += [
            ("paced 64 streams: added TTFT p50 (ms)", paced.ttft50 * 1000, 1.0, ".2f"),
            ("paced 64 streams: added TTFT p99 (ms)", paced.ttft99 * 1000, 5.0, ".2f"),
            ("paced 64 streams: CPU s per 1,000 chunks", paced.cpu_per_1k, 0.05, ".4f"),
        ]
    unpaced = [row.chunks_per_s for (mode, _), row in medians.items() if mode == "unpaced"]
    if not checks and not unpaced:
        return
    print("-- targets (one router worker) --")
    for label, value, bound, spec in checks:
        print(f"  [{'met' if value <= bound else 'MISSED'}] {label} {value:{spec}} <= {bound:g}")
    if unpaced:
        best = max(unpaced)
        print(f"  [{'met' if best >= 20000 else 'MISSED'}] unpaced chunks/s {best:.0f} >= 20000")


def _versus(upstream: str, router: str, pid: int, args: argparse.Namespace, tmp: Path) -> None:
    """The side-by-side with vllm-router (imported here: that module builds on this one)."""
    from benchmarks import proxy_floor
    from benchmarks import proxy_versus as vs

    floor_argv = [sys.executable, "-m", "benchmarks.proxy_floor", upstream]
    floor, floor_url = spawn_ready(floor_argv, proxy_floor.READY, 30)
    lean, lean_url = spawn_ready([*floor_argv, "--lean"], proxy_floor.READY, 30)
    proxies = [vs.Proxy("turnout", router, pid), vs.Proxy("floor", floor_url, floor.pid),
               vs.Proxy("floor-lean", lean_url, lean.pid)]  # fmt: skip
    base = None
    if args.baseline:  # the router package imported from that tree, on the same config
        run = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1));"
               " runpy.run_module('turnout', run_name='__main__')")  # fmt: skip
        cfg = _router_config(upstream, tmp, access_log=not args.no_access_log)
        argv = [sys.executable, "-c", run, args.baseline, "serve", "--config", str(cfg)]
        base, base_url = spawn_ready(argv, "turnout listening on ", 30)
        proxies.append(vs.Proxy("baseline", base_url, base.pid))
    rust, found = vs.start_vllm_router(upstream, tmp)  # its URL, or why it cannot run
    try:
        if rust is not None:
            proxies.append(vs.Proxy("vllm-router", found, rust.pid))
        for proxy in proxies[1:] if args.pin else ():
            os.sched_setaffinity(proxy.pid, {0})
        print(
            f"{vs.STREAMS} closed-loop streams paced {vs.GAP_MS:g} ms, {vs.LENGTHS} chunks, then"
            f" non-streamed one-chunk answers; median of {args.rounds} rounds,"
            f" {os.cpu_count()} CPUs"
        )
        vs.report(vs.measure(upstream, proxies, args.rounds, 8000), None if rust else found)
    finally:
        for proc in (floor, lean, base, rust):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--chunks", type=int, default=64, help="events per stream")
    ap.add_argument("--streams", type=int, default=512, help="streams per run (>= concurrency)")
    ap.add_argument("--concurrency", default="1,64,256")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians printed")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="give the router CPU 0 and the load generator and upstream CPU 1, as a router has\n"
        "its own core in production (on 2 cores, three busy processes otherwise wait on\n"
        "the scheduler, which shows up as tens of ms at P99 on either side)",
    )
    ap.add_argument(
        "--burst",
        action="store_true",
        help="start every stream at once: paced streams then also end together, and each\n"
        "round of requests arrives as one burst of `concurrency` (a thundering herd)",
    )
    ap.add_argument(
        "--no-access-log",
        action="store_true",
        help="turn the router's access log off (on by default, as in production); with\n"
        "--chunks 1, the CPU figure is then per 1,000 requests, so the two runs side by side\n"
        "give the access line's cost per request",
    )
    ap.add_argument(
        "--versus",
        action="store_true",
        help="instead: Turnout and vllm-router side by side (benchmarks/proxy_versus.py)",
    )
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="with --versus: also a router run from the source tree DIR (say, an older commit\n"
        "checked out with `git worktree add DIR COMMIT`), as its own row",
    )
    ap.add_argument("--upstream-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.upstream_server:
        uvloop.run(_serve_upstream())
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    exe = sys.executable
    up_proc, upstream = spawn_ready([exe, "-m", "benchmarks.proxy_overhead", "--upstream-server"],
                                    UPSTREAM_READY, 30)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _router_config(upstream, Path(tmp), access_log=not args.no_access_log)
        r_proc, router = spawn_ready([exe, "-m", "turnout", "serve", "--config", str(cfg)],
                                     "turnout listening on ", 30)  # fmt: skip
        if args.pin:
            os.sched_setaffinity(r_proc.pid, {0})
            os.sched_setaffinity(up_proc.pid, {1})
            os.sched_setaffinity(0, {1})
        try:
            if args.versus:
                _versus(upstream, router, r_proc.pid, args, Path(tmp))
                return 0
            print(
                f"{args.chunks} chunks per stream, {args.streams} streams per run, median of "
                f"{args.rounds} rounds, 1 router worker, {os.cpu_count()} CPUs"
                + (" (router pinned to CPU 0, the rest to CPU 1)" if args.pin else "")
                + (", streams started in one burst" if args.burst else "")
                + (", access log off" if args.no_access_log else ", access log on")
            )
            print(f"{'mode':8} {'conc':>5} {'+TTFT p50':>10} {'+TTFT p99':>10} {'+E2E p50':>10} "
                  f"{'+E2E p99':>10} {'CPU s/1k chunks':>16} {'chunks/s':>9} "
                  f"{'chunks/s per router core':>25}")  # fmt: skip
            medians: dict[tuple[str, int], Row] = {}
            for mode, gap in (("paced", 5.0), ("unpaced", 0.0)):
                for conc in levels:
                    # At least four streams per connection, so most run in the steady state.
                    streams = max(4 * conc, args.streams) if conc > 1 else min(args.streams, 40)
                    rows = [_round(upstream, router, r_proc.pid, conc, streams, args.chunks, gap,
                                   args.burst) for _ in range(args.rounds)]  # fmt: skip

                    m = medians[mode, conc] = Row(
                        *(statistics.median(getattr(r, f.name) for r in rows) for f in fields(Row))
                    )
                    ms = 1000.0
                    print(
                        f"{mode:8} {conc:>5} {m.ttft50 * ms:>8.2f}ms {m.ttft99 * ms:>8.2f}ms "
                        f"{m.e2e50 * ms:>8.2f}ms {m.e2e99 * ms:>8.2f}ms {m.cpu_per_1k:>16.4f} "
                        f"{m.chunks_per_s:>9.0f} {1000 / m.cpu_per_1k:>25.0f}",
                        flush=True,
                    )
            _print_targets(medians)
        finally:
            for proc in (r_proc, up_proc):
                proc.terminate()
                proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A routing contest on shared-prefix traffic: four emulated vLLM replicas with prefix caches.

A Mooncake-style trace (``hash_ids`` name shared 512-token prompt blocks, which ``replay``
turns into byte-identical prompt prefixes) is replayed, time-compressed, through:

* Turnout under ``round-robin``, ``least-outstanding``, session affinity (a pipeline with
  the ``session-affinity`` scorer: the trace has no session ids, so it hashes the prompt's
  first 512 characters) and ``cache-aware``;
* vllm-router (the Rust router; ``pip install vllm-router``) with its ``round_robin`` and
  ``cache_aware`` policies at their defaults, when its binary is found (``--vllm-router``).

Each configuration gets fresh replicas (empty caches, zeroed counters) and a fresh router.
The replicas are the ``vllm`` profile as one engine each (``ranks=1``, so one prefix cache per
replica) with ``--kv-tokens`` of KV cache, small enough that where a prefix goes matters. It
prints P50/P90 TTFT, mean E2E (model seconds: wall time x time scale), output throughput
(tokens per model second), the prefix-cache hit rate summed over the replicas' /metrics
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``), and the hit rate an
oracle would reach (every request finds the longest run of leading ``hash_ids`` any earlier
request had, in one cache without limit). Beside them, what the trace asks of the pool whatever
the routing: its offered prompt tokens per second against the replicas' prefill capacity,
each row's prefill load (the prompt tokens its hit rate leaves uncached, over that capacity:
above 1 the queues grow), and the oracle's P90 TTFT floor (every request prefilling only the
tokens the oracle could not have cached, alone on a replica).

The default trace, ``benchmarks/fixtures/shared_prefix_trace.jsonl``, is synthetic (written by
``--write-trace``): tenants with shared system prompts and multi-turn conversations whose
every turn extends the previous one. Pass the public Mooncake sample as ``--trace``::

    .venv/bin/python -m benchmarks.prefix_routing [--trace FILE] [--time-scale 10]
        [--vllm-router PATH] [--only cache-aware,round-robin]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from benchmarks.redis_server import redis_server
from emulator.profiles import Profile, load_profile
from router.server.children import spawn_ready, stop_all
from turnout.common.capture import parse_line

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "benchmarks" / "fixtures" / "shared_prefix_trace.jsonl"
BLOCK_TOKENS = 512
MAX_MODEL_LEN = 32768
FLEET = "cache-aware 2x2"
"""Two routers of two workers each, the trace split evenly between them (``--fleet``)."""
TURNOUT = {
    "round-robin": {"type": "round-robin"},
    "least-outstanding": {"type": "least-outstanding"},
    "session-affinity": {
        "type": "pipeline",
        "params": {"scorers": ["session-affinity", {"type": "least-requests", "weight": 0.1}]},
    },
    "cache-aware": {"type": "cache-aware"},
}
VLLM_ROUTER = ("vllm-router round_robin", "vllm-router cache_aware")


@dataclass(frozen=True)
class Figures:
    """One configuration's results (model seconds and tokens per model second)."""

    completed: int
    failed: int
    p50_ttft: float
    p90_ttft: float
    mean_e2e: float
    throughput: float
    hit_rate: float


def write_trace(path: Path, *, seed: int = 7, requests: int = 600, rate: float = 3.0) -> None:
    """A synthetic Mooncake-style trace: 24 tenants (Zipf-like popularity) with 8-40 block
    system prompts; conversations of 1-8 turns, each turn one new block on the last."""
    rng = random.Random(seed)
    ids = iter(range(10**9))
    tenants = [[next(ids) for _ in range(rng.randint(8, 40))] for _ in range(24)]
    weights = [1 / (k + 1) for k in range(len(tenants))]
    active: list[tuple[list[int], int]] = []  # (blocks so far, turns left)
    t = 0.0
    lines = []
    for _ in range(requests):
        t += rng.expovariate(rate)
        if not active or rng.random() < 0.35:
            tenant = rng.choices(tenants, weights)[0]
            active.append(([*tenant, next(ids)], rng.randint(1, 8)))
            k = len(active) - 1
        else:
            k = rng.randrange(len(active))
            blocks, left = active[k]
            active[k] = ([*blocks, next(ids)], left)
        blocks, left = active[k]
        output = rng.randint(16, 160)
        prompt = min(len(blocks) * BLOCK_TOKENS - rng.randint(0, 300), MAX_MODEL_LEN - output)
        doc = {"timestamp": round(t * 1000), "input_length": prompt, "output_length": output,
               "hash_ids": blocks}  # fmt: skip
        lines.append(orjson.dumps(doc))
        if left <= 1:
            active.pop(k)
        else:
            active[k] = (blocks, left - 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")


def thin(trace: Path, every: int, out: Path) -> Path:
    """Write every ``every``-th row of ``trace`` to ``out``; return ``out``."""
    with trace.open("rb") as f:
        out.write_bytes(b"".join(line for n, line in enumerate(f) if n % every == 0))
    return out


@dataclass(frozen=True)
class Bounds:
    """What a trace asks of the pool whatever the routing (model seconds, prompt tokens)."""

    oracle_hit_rate: float
    pooled_hit_rate: float
    """The same with one LRU cache of the pool's KV tokens (replicas x ``--kv-tokens``):
    nearer what four bounded caches can reach."""
    offered: float
    """Prompt tokens per second of the requests the engines accept."""
    capacity: float
    """Prompt tokens per second the pool prefills flat out (full token budget every step)."""
    p90_floor: float
    """P90 TTFT if every request prefilled only what the oracle could not have cached, alone
    on its replica (no queueing, no decoding beside it)."""

    def load(self, hit_rate: float) -> float:
        """The uncached prefill a hit rate leaves, as a share of the pool's capacity."""
        return self.offered * (1 - hit_rate) / self.capacity


def prefill_seconds(profile: Profile, tokens: int) -> float:
    """Model seconds a ``mixed``-scheduling engine takes to prefill ``tokens`` alone."""
    steps = -(-tokens // profile.max_num_batched_tokens)
    return (steps * profile.step_base_ms + tokens * profile.step_per_prefill_token_us / 1e3) / 1e3


def trace_bounds(
    path: Path, max_requests: int | None, profile: Profile, replicas: int, compression: float
) -> Bounds:
    """The oracle's hit rate (one unbounded cache: each request finds its longest leading run
    of ``hash_ids`` seen before, in 16-token engine blocks, its last prompt token always
    computed) and that of one LRU cache of the pool's KV, the offered prompt tokens and the
    pool's prefill capacity per model second
    (the trace's span divided by ``compression``, replay speed over time scale), and the P90
    TTFT floor the oracle's uncached tokens set."""
    seen: set[tuple[int, ...]] = set()
    lru: OrderedDict[tuple[int, ...], None] = OrderedDict()
    room = replicas * profile.kv_cache_tokens // BLOCK_TOKENS
    hits = pooled = total = 0
    first = last = None
    floors: list[float] = []
    with path.open("rb") as f:
        for n, line in enumerate(f):
            if max_requests is not None and n >= max_requests:
                break
            doc = orjson.loads(line)
            first = doc["timestamp"] if first is None else first
            last = doc["timestamp"]
            prompt, ids = doc["input_length"], tuple(doc.get("hash_ids") or ())
            if prompt + doc["output_length"] > MAX_MODEL_LEN:
                continue  # rejected by the engine: never looked up
            heads = [ids[: k + 1] for k in range(len(ids))]
            run = next((k for k, h in enumerate(heads) if h not in seen), len(heads))
            seen.update(heads)
            hit = min(run * BLOCK_TOKENS, (prompt - 1) // 16 * 16)
            run = next((k for k, h in enumerate(heads) if h not in lru), len(heads))
            pooled += min(run * BLOCK_TOKENS, (prompt - 1) // 16 * 16)
            for h in reversed(heads):  # the head used last, evicted last (as the engine)
                lru[h] = None
                lru.move_to_end(h)
            while len(lru) > room:
                lru.popitem(last=False)
            hits += hit
            total += prompt
            floors.append(prefill_seconds(profile, prompt - hit))
    span = ((last or 0) - (first or 0)) / 1e3 / compression
    step = profile.step_base_ms / 1e3 + profile.max_num_batched_tokens * (
        profile.step_per_prefill_token_us / 1e6
    )
    return Bounds(
        oracle_hit_rate=hits / total if total else 0.0,
        pooled_hit_rate=pooled / total if total else 0.0,
        offered=total / span if span > 0 else float("nan"),
        capacity=replicas * profile.max_num_batched_tokens / step,
        p90_floor=percentile(floors, 0.9),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def replicas(args: argparse.Namespace) -> Iterator[list[str]]:
    """``--replicas`` fresh emulated vLLM replicas; their URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for i in range(args.replicas):
            argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port", "0",
                    "--time-scale", str(args.time_scale), "--seed", str(i),
                    "--set", "ranks=1", "--set", f"kv_cache_tokens={args.kv_tokens}"]  # fmt: skip
            proc, url = spawn_ready(argv, "emulator listening on", 30)
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        stop_all(procs)


@contextmanager
def turnout(
    urls: Sequence[str],
    directory: Path,
    name: str = "router",
    workers: int = 1,
    redis: str | None = None,
) -> Iterator[str]:
    """A router of ``workers`` in front of ``urls``; with ``redis``, sharing through it."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": f"r{i}", "engine": "vllm", "url": u} for i, u in enumerate(urls)],
        "policies": TURNOUT,
        "default_policy": "round-robin",
    }
    if redis is not None:
        doc["limits"] = {"store": {"redis": {"url": redis}}}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path), "--port", "0",
            "--workers", str(workers)]  # fmt: skip
    proc, url = spawn_ready(argv, "turnout listening on", 60)
    try:
        yield url
    finally:
        stop_all([proc], 20)


def vllm_router_binary() -> str | None:
    """vllm-router's executable: beside this interpreter (installed into its venv), else on
    the PATH; None when it is not installed."""
    beside = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    return beside if os.path.exists(beside) else shutil.which("vllm-router")


def start_vllm_router(
    binary: str,
    policy: str,
    urls: Sequence[str],
    directory: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """vllm-router with ``policy`` in front of ``urls`` (``env`` added to its environment),
    once it answers (within ``timeout`` seconds); its log in ``directory``."""
    port = free_port()
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--prometheus-port", str(free_port()), "--log-level", "warning",
            "--worker-urls", *urls]  # fmt: skip
    with (directory / f"vllm-router-{policy}.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
                if resp.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_all([proc], 20)
            raise RuntimeError(f"vllm-router did not come up (see {directory})")
        time.sleep(0.5)


@contextmanager
def vllm_router(binary: str, policy: str, urls: Sequence[str], directory: Path) -> Iterator[str]:
    proc, url = start_vllm_router(binary, policy, urls, directory)
    try:
        yield url
    finally:
        stop_all([proc], 20)


def cache_counters(urls: Sequence[str]) -> tuple[float, float]:
    """Summed ``vllm:prefix_cache_hits_total`` and ``..._queries_total`` of the replicas."""
    hits = queries = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                name, _, value = line.partition("{")
                if name == "vllm:prefix_cache_hits_total":
                    hits += float(value.rsplit(" ", 1)[1])
                elif name == "vllm:prefix_cache_queries_total":
                    queries += float(value.rsplit(" ", 1)[1])
    return hits, queries


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def replay(targets: Sequence[str], policy: str | None, urls: Sequence[str],
           args: argparse.Namespace, directory: Path, label: str) -> Figures:  # fmt: skip
    """Replay the trace through ``targets``, its rows dealt out to them in turn (each part
    on the trace's own clock, all at once); figures from the per-request results."""
    traces = [args.trace]
    if len(targets) > 1:
        rows = args.trace.read_bytes().splitlines(keepends=True)
        if args.max_requests is not None:
            rows = rows[: args.max_requests]
        traces = [directory / f"{label}.part{i}.jsonl" for i in range(len(targets))]
        for i, part in enumerate(traces):
            part.write_bytes(b"".join(rows[i :: len(targets)]))
    runs, outputs = [], []
    for i, (url, trace) in enumerate(zip(targets, traces, strict=True)):
        results, report = directory / f"{label}.{i}.results.jsonl", directory / f"{label}.{i}.json"
        argv = [sys.executable, "-m", "turnout", "replay", str(trace), "--target", url,
                "--speed", str(args.speed or args.time_scale), "--no-progress",
                "--results", str(results), "--out", str(report)]  # fmt: skip
        if policy is not None:
            argv += ["--policy", policy]
        if args.max_requests is not None and len(targets) == 1:
            argv += ["--max-requests", str(args.max_requests)]
        runs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
        outputs.append((results, report))
    for run in runs:
        if run.wait(timeout=3600) != 0:
            raise RuntimeError(f"replay failed (exit {run.returncode})")
    scale = args.time_scale
    ttfts, e2es, failed = [], [], 0
    lines = [line for results, _ in outputs for line in results.read_bytes().splitlines()]
    for line in lines:
        rec = parse_line(line)
        obs = rec.obs
        if rec.resp is None or rec.resp.status != 200 or obs is None or obs.ttft_ms is None:
            failed += 1
            continue
        ttfts.append(obs.ttft_ms / 1e3 * scale)
        e2es.append((obs.e2e_ms or 0.0) / 1e3 * scale)
    throughput = sum(
        orjson.loads(report.read_bytes())["runs"][0]["overall"]["output_throughput"]
        for _, report in outputs
    )
    hits, queries = cache_counters(urls)
    return Figures(
        completed=len(ttfts),
        failed=failed,
        p50_ttft=percentile(ttfts, 0.5),
        p90_ttft=percentile(ttfts, 0.9),
        mean_e2e=sum(e2es) / len(e2es) if e2es else float("nan"),
        throughput=throughput / scale,
        hit_rate=hits / queries if queries else 0.0,
    )


def run_one(label: str, args: argparse.Namespace, binary: str | None, directory: Path) -> Figures:
    with replicas(args) as urls:
        if label.startswith("vllm-router"):
            assert binary is not None
            with vllm_router(binary, label.split()[1], urls, directory) as url:
                return replay([url], None, urls, args, directory, label.replace(" ", "-"))
        if label == FLEET:  # two routers of two workers, one Redis, the trace split evenly
            with (
                redis_server(directory) as (redis, _),
                turnout(urls, directory, "a", workers=2, redis=redis) as a,
                turnout(urls, directory, "b", workers=2, redis=redis) as b,
            ):
                return replay([a, b], "cache-aware", urls, args, directory, "fleet")
        with turnout(urls, directory) as url:
            return replay([url], label, urls, args, directory, label)


def table(rows: dict[str, Figures], bounds: Bounds) -> str:
    head = (f"| {'configuration':<26} | {'ok/failed':>9} | {'P50 TTFT s':>10} "
            f"| {'P90 TTFT s':>10} | {'mean E2E s':>10} | {'out tok/s':>9} | {'hit rate':>8} "
            f"| {'prefill load':>12} |")  # fmt: skip
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for label, f in rows.items():
        lines.append(
            f"| {label:<26} | {f'{f.completed}/{f.failed}':>9} | {f.p50_ttft:>10.2f} "
            f"| {f.p90_ttft:>10.2f} | {f.mean_e2e:>10.2f} | {f.throughput:>9.1f} "
            f"| {f.hit_rate:>8.1%} | {bounds.load(f.hit_rate):>12.2f} |"
        )
    hit = bounds.oracle_hit_rate
    lines.append(f"| {'oracle placement':<26} | {'':>9} | {'':>10} | {bounds.p90_floor:>10.2f} "
                 f"| {'':>10} | {'':>9} | {hit:>8.1%} | {bounds.load(hit):>12.2f} |")  # fmt: skip
    hit = bounds.pooled_hit_rate
    lines.append(f"| {'oracle, one pool-sized LRU':<26} | {'':>9} | {'':>10} | {'':>10} "
                 f"| {'':>10} | {'':>9} | {hit:>8.1%} | {bounds.load(hit):>12.2f} |")  # fmt: skip
    return "\n".join(lines)


def targets(rows: dict[str, Figures], bounds: Bounds) -> list[str]:
    """The issue's targets for cache-aware, each with its measured ratio."""
    ca = rows.get("cache-aware")
    if ca is None:
        return []
    out = [f"cache-aware hit rate / oracle: {ca.hit_rate / bounds.oracle_hit_rate:.2f} "
           f"(target >= 0.90); / one pool-sized LRU: "
           f"{ca.hit_rate / bounds.pooled_hit_rate:.2f}"]  # fmt: skip
    for other, bound in (("round-robin", 0.5), ("vllm-router cache_aware", 0.8)):
        if other in rows:
            o = rows[other]
            out.append(f"cache-aware P90 TTFT / {other}: {ca.p90_ttft / o.p90_ttft:.2f} "
                       f"(target <= {bound}); throughput ratio "
                       f"{ca.throughput / o.throughput:.2f} (target >= 1.0)")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--trace", type=Path, default=FIXTURE, help="Mooncake-style JSONL")
    ap.add_argument("--time-scale", type=float, default=2.0, help="emulators' time scale")
    ap.add_argument(
        "--speed",
        type=float,
        default=None,
        help="replay speed (default: the time scale, i.e. the trace's own load)",
    )
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--kv-tokens", type=int, default=131072, help="KV cache per replica")
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument(
        "--every",
        type=int,
        default=1,
        help="replay every K-th row of the trace, at its own time: a K-times thinner load "
        "over the whole span, which keeps the sharing that builds up across it",
    )
    ap.add_argument("--only", default=None, help="comma-separated configurations to run")
    ap.add_argument(
        "--vllm-router",
        default=shutil.which("vllm-router"),
        help="vllm-router binary (default: from PATH)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run directory (results, logs)")
    ap.add_argument(
        "--fleet",
        action="store_true",
        help=f"also '{FLEET}': cache-aware through two routers of two workers sharing a\n"
        "redis-server (started here), the trace's rows dealt out to the two in turn",
    )
    ap.add_argument("--write-trace", type=Path, default=None,
                    help="write the synthetic trace to this path and exit")  # fmt: skip
    args = ap.parse_args(argv)
    if args.write_trace is not None:
        write_trace(args.write_trace)
        return 0
    labels = [*TURNOUT, *VLLM_ROUTER, *([FLEET] if args.fleet else [])]
    if args.only:
        labels = [x for x in labels if x in args.only.split(",")]
    if args.vllm_router is None:
        print("vllm-router: no binary found (pip install vllm-router, or --vllm-router PATH); "
              "its rows are left out", file=sys.stderr)  # fmt: skip
        labels = [x for x in labels if not x.startswith("vllm-router")]
    rows: dict[str, Figures] = {}
    tmp = Path(tempfile.mkdtemp(prefix="prefix-routing-"))
    name = args.trace.name
    try:
        if args.every > 1:
            name += f" (every {args.every}th row)"
            args.trace = thin(args.trace, args.every, tmp / "trace.jsonl")
        profile = load_profile("vllm", {"ranks": 1, "kv_cache_tokens": args.kv_tokens})
        compression = (args.speed or args.time_scale) / args.time_scale
        bounds = trace_bounds(args.trace, args.max_requests, profile, args.replicas, compression)
        for label in labels:
            started = time.monotonic()
            rows[label] = run_one(label, args, args.vllm_router, tmp)
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"{label}: done in {time.monotonic() - started:.0f} s (load average {load})",
                  file=sys.stderr)  # fmt: skip
    finally:
        if args.keep:
            print(f"run directory kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{name}: {args.replicas} vLLM replicas (ranks=1, {args.kv_tokens} KV "
          f"tokens each), time scale {args.time_scale:g}; latencies in model seconds")  # fmt: skip
    print(f"offered {bounds.offered:,.0f} prompt tokens/s against a prefill capacity of "
          f"{bounds.capacity:,.0f}/s; prefill load = uncached share of the offered tokens / "
          "capacity; the oracle's P90 is the floor its uncached tokens set")  # fmt: skip
    print(table(rows, bounds))
    for line in targets(rows, bounds):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

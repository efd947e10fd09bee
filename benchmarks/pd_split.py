"""Would a prefill/decode split close DeepInfer's TTFT gap? Co-located against P/D (issue 28).

Three deployments, each co-located and split, on two workloads:

* DeepInfer on eight engines (the shipped profile: eight data-parallel ranks, one a GPU, its
  cold start included) against a 4 + 4 split: a four-rank prefill engine and a four-rank
  decode engine, the router's ``pd`` policy between them;
* vLLM the same way;
* the embedded default (a vLLM engine and a DeepInfer engine, eight GPUs each, ``adaptive``)
  against a split of the same two: vLLM prefills, DeepInfer decodes.

Workloads: the public run's shape (100 requests at concurrency 16, 8,192 in / 1,024 out,
streamed, closed loop) and a mixed trace (open loop, Poisson at ``--rate``: 70% chat of 500 to
2,000 prompt tokens and 100 to 300 out, 30% long documents of 6,000 to 8,192 in and 512 to
1,024 out). Both are written as Mooncake-format traces, so the live replayer and the
simulator read the same requests. ``replay simulate``'s loop runs them in virtual time (the
closed loop through :meth:`~replay.simulate.loop.Simulation.follow`, as ``replay
--concurrency`` sends live); with ``--live`` the router runs them too, its emulators as
child processes at ``--time-scale`` (figures are scaled back to model seconds).

Reported: TTFT mean and P95, mean ITL, output throughput, and cost per million output tokens
(GPUs x ``--gpu-usd-per-hour`` over the run's duration, per output token). Then a sweep over
what decides a split: the KV bytes per token (DeepSeek-V3's MLA cache in FP8 and BF16, and a
grouped-query model's) and the link bandwidth per GPU::

    .venv/bin/python -m benchmarks.pd_split [--live --time-scale 10] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from replay.client import Result
from replay.plan import Planned
from replay.report import Acc
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Source
from router.config.parse import parse_config
from router.server.children import spawn_ready, stop_all

KV_BYTES = {"MLA FP8": 35136, "MLA BF16": 70272, "GQA BF16": 249856}
"""Bytes of KV per token: DeepSeek-V3's cache (576 values x 61 layers) in 1 and 2 bytes, and
a grouped-query model of the same depth (8 KV heads of 128, keys and values, BF16)."""
LINKS = (0.5, 5.0, 50.0)
"""GB/s per GPU: a 4 Gb/s TCP path, a 40 Gb/s one, and one 400 Gb/s NIC (the default)."""
DEFAULT_KV, DEFAULT_LINK = 70272, 50.0
CONCURRENCY = 16


@dataclass(frozen=True)
class Setup:
    """One deployment: its router config, the policy it runs and the GPUs it holds."""

    name: str
    doc: dict[str, Any]
    policy: str
    gpus: int


def _emulator(profile: str, time_scale: float, **keys: object) -> dict[str, Any]:
    return {"profile": profile, "time_scale": time_scale, "set": dict(keys)}


def _doc(backends: list[dict[str, Any]], policies: dict[str, Any], default: str) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": backends,
        "policies": policies,
        "default_policy": default,
        "timeouts": {"interactive": {"first_byte": 600, "idle": 600, "total": 3600}},
        "access_log": {"enabled": False},
    }


def colocated(profile: str, scale: float) -> Setup:
    """One engine of eight ranks (eight GPUs), as the profile is fitted."""
    backend = {"name": profile, "engine": profile, "emulator": _emulator(profile, scale)}
    pinned = {"pinned": {"type": "pinned", "params": {"backend": profile}}}
    return Setup(f"{profile} co-located 8", _doc([backend], pinned, "pinned"), "pinned", 8)


def _split_backends(
    prefill: str, decode: str, ranks: tuple[int, int], scale: float, kv_bytes: int, link: float
) -> list[dict[str, Any]]:
    """A prefill and a decode engine of ``ranks`` GPUs each (a rank's share of the KV cache
    as in the eight-rank profile); the decode engine's link is ``link`` GB/s per GPU."""

    def size(n: int) -> dict[str, int]:
        return {"ranks": n, "kv_cache_tokens": 131072 * n} if n < 8 else {}

    kv = {"kv_bytes_per_token": kv_bytes}
    p, d = ranks
    return [
        {"name": "prefill", "engine": prefill,
         "emulator": _emulator(prefill, scale, role="prefill", **size(p), **kv)},
        {"name": "decode", "engine": decode,
         "emulator": _emulator(decode, scale, role="decode", cold_prefills=0,
                               kv_link_gb_per_s=link * d, **size(d), **kv)},
    ]  # fmt: skip


PD = {"pd": {"type": "pd", "params": {"prefill": ["prefill"], "decode": ["decode"]}}}


def split(
    profile: str, scale: float, kv_bytes: int, link: float, prefill: int = 4, warm: bool = False
) -> Setup:
    """A prefill engine of ``prefill`` ranks and a decode engine of the other ``8 - prefill``
    of ``profile`` (``warm``: no cold start on the prefill engine)."""
    backends = _split_backends(profile, profile, (prefill, 8 - prefill), scale, kv_bytes, link)
    if warm:
        backends[0]["emulator"]["set"]["cold_prefills"] = 0
    name = f"{profile} {prefill}P+{8 - prefill}D"
    return Setup(name, _doc(backends, PD, "pd"), "pd", 8)


def default_pair(scale: float) -> Setup:
    """The embedded default: vLLM and DeepInfer, eight GPUs each, ``adaptive``."""
    doc = yaml.safe_load((Path(__file__).parent.parent / "config" / "router.yaml").read_text())
    for b in doc["backends"]:
        b["emulator"]["time_scale"] = scale
    doc["listen"] = {"host": "127.0.0.1", "port": 0}
    doc["access_log"] = {"enabled": False}
    doc.pop("batch", None)  # its store is one per data directory: another router may hold it
    doc["timeouts"]["interactive"] = {"first_byte": 600, "idle": 600, "total": 3600}
    return Setup("default pair (adaptive)", doc, "adaptive", 16)


def default_split(scale: float, kv_bytes: int, link: float) -> Setup:
    """The same two engines split: vLLM prefills, DeepInfer decodes."""
    backends = _split_backends("vllm", "deepinfer", (8, 8), scale, kv_bytes, link)
    return Setup("default pair 8P+8D", _doc(backends, PD, "pd"), "pd", 16)


def public_trace(path: Path, requests: int = 100) -> Path:
    """The public run's requests as a Mooncake trace (all at once: the loop paces them)."""
    rows = [{"timestamp": 0, "input_length": 8192, "output_length": 1024}] * requests
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mixed_trace(path: Path, rate: float, requests: int, seed: int = 0) -> Path:
    """Chat and long documents, Poisson at ``rate`` a second (see the module)."""
    rng, t, rows = random.Random(seed), 0.0, []
    for _ in range(requests):
        t += rng.expovariate(rate)
        chat = rng.random() < 0.7
        prompt = rng.randint(500, 2000) if chat else rng.randint(6000, 8192)
        out = rng.randint(100, 300) if chat else rng.randint(512, 1024)
        rows.append({"timestamp": int(t * 1000), "input_length": prompt, "output_length": out})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@dataclass
class Figures:
    ttft_mean: float
    ttft_p95: float
    itl: float
    throughput: float
    usd_per_m: float
    failed: int


def _figures(metrics: dict[str, Any], gpus: int, usd: float, scale: float = 1.0) -> Figures:
    """Model-time figures from a report's metrics measured at time scale ``scale``."""
    duration = metrics["duration"] * scale
    out = metrics["total_output_tokens"]
    cost = gpus * usd * duration / 3600
    return Figures(
        metrics["mean_ttft_ms"] * scale / 1e3,
        metrics["p95_ttft_ms"] * scale / 1e3,
        (metrics["mean_itl_ms"] or 0.0) * scale,
        out / duration,
        cost / out * 1e6 if out else float("nan"),
        metrics["failed"],
    )


def simulate(setup: Setup, trace: Path, closed: bool, scale: float = 1.0) -> dict[str, Any]:
    """One run in virtual time; the report's metrics (vLLM's names, ms). Engines at time
    ``scale`` get the trace's arrivals compressed by it, as ``replay --speed`` sends them."""
    world = World(parse_config(setup.doc), {})
    items: Iterator[Item] = iter(Source(str(trace), model=world.model()))
    acc = Acc()
    sim: Simulation

    def on_result(item: Item, r: Result, sent: float) -> None:
        acc.add(r)
        nxt = next(items, None) if closed else None
        if nxt is not None:
            sim.follow(Planned(world.now, nxt))

    sim = Simulation(world, world.policies[setup.policy], setup.policy, on_result,
                     closed_loop=closed)  # fmt: skip
    if closed:
        for i, item in zip(range(CONCURRENCY), items, strict=False):
            sim.follow(Planned(0.002 * i, item))
        end = sim.run(iter(()))
    else:
        end = sim.run(Planned((it.record.t_offset_ms or 0.0) / 1e3 / scale, it) for it in items)
    return dict(acc.metrics(end))


def live(setup: Setup, trace: Path, closed: bool, scale: float, tmp: Path) -> dict[str, Any]:
    """One run through the router and its emulators at ``scale``; the report's metrics."""
    config, out = tmp / "router.yaml", tmp / "live.json"
    config.write_text(yaml.safe_dump(setup.doc))
    argv = [sys.executable, "-m", "turnout", "serve", "--port", "0", "--config", str(config)]
    proc, url = spawn_ready(argv, "turnout listening on", 120)
    pace = ["--concurrency", str(CONCURRENCY)] if closed else ["--speed", str(scale)]
    try:
        subprocess.run(
            [sys.executable, "-m", "turnout", "replay", str(trace), "--target", url,
             "--policy", setup.policy, "--out", str(out), "--no-progress", *pace],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        stop_all([proc], 30)
    (run,) = json.loads(out.read_text())["runs"]
    return dict(run["overall"])


HEAD = (
    f"{'workload':9} {'setup':26} {'mode':12} {'TTFT mean s':>11} {'TTFT P95 s':>10} "
    f"{'ITL ms':>7} {'out tok/s':>9} {'$/1M out':>8}"
)


def _row(workload: str, setup: Setup, mode: str, f: Figures) -> str:
    failed = f"  ({f.failed} failed)" if f.failed else ""
    return (
        f"{workload:9} {setup.name:26} {mode:12} {f.ttft_mean:>11.2f} {f.ttft_p95:>10.2f} "
        f"{f.itl:>7.2f} {f.throughput:>9,.0f} {f.usd_per_m:>8.2f}{failed}"
    )


def table(a: argparse.Namespace, tmp: Path) -> None:
    """The comparison: every setup, both workloads, simulated (and live)."""
    traces = {
        "public": (public_trace(tmp / "public.jsonl"), True),
        "mixed": (mixed_trace(tmp / "mixed.jsonl", a.rate, a.mixed_requests), False),
    }
    scale = a.time_scale if a.live else 1.0
    pairs: list[tuple[Setup, Setup]] = [
        (colocated("deepinfer", scale), split("deepinfer", scale, DEFAULT_KV, DEFAULT_LINK)),
        (colocated("vllm", scale), split("vllm", scale, DEFAULT_KV, DEFAULT_LINK)),
        (default_pair(scale), default_split(scale, DEFAULT_KV, DEFAULT_LINK)),
    ]
    print(HEAD)
    for workload, (trace, closed) in traces.items():
        for pair in pairs:
            for setup in pair:
                metrics = simulate(setup, trace, closed, scale)
                sim = _figures(metrics, setup.gpus, a.gpu_usd_per_hour, scale)
                print(_row(workload, setup, "simulated", sim), flush=True)
                if a.live:
                    got = live(setup, trace, closed, scale, tmp)
                    fig = _figures(got, setup.gpus, a.gpu_usd_per_hour, scale)
                    print(_row(workload, setup, f"live x{scale:g}", fig), flush=True)


def _sweep_row(profile: str, label: str, link: str, f: Figures) -> str:
    return (
        f"{profile:10} {label:20} {link:>8} {f.ttft_mean:>11.2f} {f.ttft_p95:>10.2f} "
        f"{f.itl:>7.2f} {f.throughput:>9,.0f}"
    )


def sweep(a: argparse.Namespace, tmp: Path) -> None:
    """The public shape split, by KV bytes per token and link bandwidth, then by the pools'
    sizes and without the cold start (simulated)."""
    trace = public_trace(tmp / "public.jsonl")

    def run(setup: Setup) -> Figures:
        return _figures(simulate(setup, trace, True), setup.gpus, a.gpu_usd_per_hour)

    print(f"\n{'engine':10} {'split':20} {'GB/s/GPU':>8} {'TTFT mean s':>11} {'TTFT P95 s':>10} "
          f"{'ITL ms':>7} {'out tok/s':>9}")  # fmt: skip
    for profile in ("deepinfer", "vllm"):
        print(_sweep_row(profile, "co-located", "", run(colocated(profile, 1.0))), flush=True)
        for label, kv in KV_BYTES.items():
            for link in LINKS:
                f = run(split(profile, 1.0, kv, link))
                print(_sweep_row(profile, f"4P+4D {label}", f"{link:g}", f), flush=True)
        for prefill, warm in ((2, False), (6, False), (4, True)):
            setup = split(profile, 1.0, DEFAULT_KV, DEFAULT_LINK, prefill, warm)
            label = setup.name.split(" ", 1)[1] + (" warm" if warm else "")
            print(_sweep_row(profile, label, f"{DEFAULT_LINK:g}", run(setup)), flush=True)
        warm_colo = colocated(profile, 1.0)
        warm_colo.doc["backends"][0]["emulator"]["set"]["cold_prefills"] = 0
        print(_sweep_row(profile, "co-located warm", "", run(warm_colo)), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pd_split", description=__doc__)
    p.add_argument("--live", action="store_true", help="also run live through the router")
    p.add_argument("--time-scale", type=float, default=10.0, help="the live emulators' scale")
    p.add_argument("--rate", type=float, default=3.0, help="the mixed trace's requests/s")
    p.add_argument("--mixed-requests", type=int, default=200)
    p.add_argument("--gpu-usd-per-hour", type=float, default=6.0, help="an assumed GPU price")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--sweep-only", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if not a.sweep_only:
            table(a, Path(tmp))
        if not a.no_sweep:
            sweep(a, Path(tmp))


if __name__ == "__main__":
    main()

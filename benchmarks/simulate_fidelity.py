"""``replay simulate`` against live ``replay`` on the same trace slice, and simulate's speed.

Fidelity: starts the router (the embedded default, or ``--config``: its emulated engines as
child processes, all on loopback), replays the slice live once per policy, simulates the same
slice with the same config, and prints per policy the live and simulated mean and P95 TTFT,
mean TPOT and output throughput side by side with their relative difference::

    .venv/bin/python -m benchmarks.simulate_fidelity fidelity TRACE --window 0:300 \\
        [--policy class-split --policy adaptive] [--config router.yaml] [--out-dir out/fidelity]

Speed: simulates TRACE (or a window of it) and prints virtual seconds per CPU second; then how
that scales with the request rate (``--speed`` 1, 2, 4: arrivals compressed) and with the
number of backends (the embedded default's two engines copied to 4 and 8, round-robin, at
the same per-backend rate)::

    .venv/bin/python -m benchmarks.simulate_fidelity speed TRACE [--window 0:3600]

Live runs take the slice's real duration per policy; the live side runs in real time on a
shared machine, so run it on a quiet one.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from router.cli import default_config_path
from router.server.children import spawn_ready, stop_all

METRICS = (
    ("mean TTFT (ms)", "mean_ttft_ms"),
    ("P95 TTFT (ms)", "p95_ttft_ms"),
    ("mean TPOT (ms)", "mean_tpot_ms"),
    ("output tok/s", "output_throughput"),
)


def _replay(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "turnout", "replay", *args], check=True, stdout=subprocess.DEVNULL
    )


def _runs(path: Path) -> dict[str, dict[str, Any]]:
    report = json.loads(path.read_text())
    return {str(r["policy"]): r for r in report["runs"]}


def fidelity(a: argparse.Namespace) -> None:
    """Live and simulated figures per policy, side by side."""
    a.out_dir.mkdir(parents=True, exist_ok=True)
    live, sim = a.out_dir / "live.json", a.out_dir / "simulated.json"
    common = [a.trace, "--window", a.window, "--sessions", a.sessions]
    for name in a.policies:
        common += ["--policy", name]
    argv = [sys.executable, "-m", "turnout", "serve", "--port", "0"]
    if a.config:
        argv += ["--config", a.config]
    if not (a.reuse_live and live.exists()):
        print(f"live replay of {a.trace} [{a.window}] through the router...", flush=True)
        proc, url = spawn_ready(argv, "turnout listening on", 120)
        try:
            _replay(*common, "--target", url, "--out", str(live), "--no-progress")
        finally:
            stop_all([proc], 30)
    print("simulating the same slice...", flush=True)
    _replay("simulate", *common, *(["--config", a.config] if a.config else []), "--out", str(sim))
    lv, sv = _runs(live), _runs(sim)
    print(f"\n{a.trace} [{a.window} s], {a.config or 'embedded default'}")
    print(f"{'policy':14} {'metric':16} {'live':>10} {'simulated':>10} {'diff':>8}")
    for name in a.policies:
        lm, sm = lv[name]["overall"], sv[name]["overall"]
        done = f"{lm['completed']}/{lm['completed'] + lm['failed']}"
        print(f"{name:14} {'completed':16} {done:>10} {sm['completed']:>10}")
        for label, key in METRICS:
            x, y = lm.get(key), sm.get(key)
            diff = f"{(y / x - 1) * 100:+.1f}%" if x and y is not None else "-"
            print(f"{'':14} {label:16} {_num(x):>10} {_num(y):>10} {diff:>8}")
        cpu = sv[name]["simulation"]["cpu_seconds"]
        print(f"{'':14} {'simulated in':16} {'':>10} {cpu:>9.2f}s")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _simulate(trace: str, window: str, config: Path | None, *extra: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = ["simulate", trace, "--window", window, "--out", str(out), *extra]
        _replay(*args, *(["--config", str(config)] if config else []))
        (run,) = json.loads(out.read_text())["runs"]
        return dict(run)


def _copies(n: int, tmp: Path) -> Path:
    """The embedded default with its backends copied to ``n`` in all (round-robin over all)."""
    doc = yaml.safe_load(default_config_path().read_text())
    base = doc["backends"]
    doc["backends"] = [
        {**copy.deepcopy(base[k % len(base)]), "name": f"{base[k % len(base)]['name']}-{k}"}
        for k in range(n)
    ]
    doc["policies"] = {"round-robin": {"type": "round-robin"}}
    doc["default_policy"] = "round-robin"
    path = tmp / f"backends-{n}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def speed(a: argparse.Namespace) -> None:
    """Virtual seconds per CPU second, by policy, request rate and number of backends."""
    print(f"{a.trace} [{a.window} s]; CPU seconds of the simulation itself (one core)")
    print(f"{'run':44} {'requests':>9} {'virtual s':>10} {'CPU s':>8} {'x real':>8}")

    def show(name: str, run: dict[str, Any]) -> None:
        m, o = run["simulation"], run["overall"]
        n = o["completed"] + o["failed"]
        ratio = m["virtual_seconds"] / max(m["cpu_seconds"], 1e-9)
        print(
            f"{name:44} {n:>9} {m['virtual_seconds']:>10.1f} {m['cpu_seconds']:>8.2f} {ratio:>8.0f}"
        )

    for policy in a.policies:
        show(
            f"{policy}, 2 backends, rate x1", _simulate(a.trace, a.window, None, "--policy", policy)
        )
    for rate in (2, 4):
        run = _simulate(a.trace, a.window, None, "--policy", "round-robin", "--speed", str(rate))
        show(f"round-robin, 2 backends, rate x{rate}", run)
    with tempfile.TemporaryDirectory() as tmp:
        for n in (2, 4, 8):
            config = _copies(n, Path(tmp))
            run = _simulate(a.trace, a.window, config, "--speed", str(n // 2))
            show(f"round-robin, {n} backends, rate x{n // 2}", run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("fidelity", "speed"))
    p.add_argument("trace")
    p.add_argument("--window", default="0:300", help="START:END seconds of the trace")
    p.add_argument("--policy", action="append", dest="policies")
    p.add_argument("--config", help="router config (default: the embedded default)")
    p.add_argument("--sessions", default="auto", choices=("auto", "infer", "off"))
    p.add_argument("--out-dir", type=Path, default=Path("out/fidelity"))
    p.add_argument(
        "--reuse-live", action="store_true", help="keep OUT_DIR/live.json from an earlier run"
    )
    a = p.parse_args(argv)
    a.policies = a.policies or ["class-split", "adaptive"]
    (fidelity if a.what == "fidelity" else speed)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

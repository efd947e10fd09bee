"""``replay simulate`` against live ``replay`` on the same traces, and simulate's speed.

Fidelity: starts the router (the embedded default plus a ``cache-aware`` policy, or
``--config``: its emulated engines as child processes, all on loopback), replays each trace
live once with every policy (the live comparison's order: warm-up, interleaved blocks),
simulates it with the same config and policies (which replay in that order too), and prints
per trace, policy and headline metric the live and simulated figures and the simulator's
error, ``(simulated - live) / live``: TTFT's mean and P95 apart from TPOT, E2E and output
throughput, as simulators are judged. The bundled capture (config/demo-capture.jsonl, at
``--capture-speed``, as ``make demo`` replays it) always runs; public traces are given on the
command line (nothing in the repository needs them), each as ``PATH[@START:END]`` (default
window ``--window``), an Azure slice and a Mooncake slice with sessions (``--sessions infer``
makes a Mooncake row that extends an earlier prompt that conversation's next turn)::

    .venv/bin/python -m benchmarks.simulate_fidelity fidelity \\
        --trace AzureLLMInferenceTrace_conv.csv@0:120 --trace synthetic_trace.jsonl@0:120 \\
        [--policy round-robin --policy class-split ...] [--markdown] [--out-dir out/fidelity]

Speed: simulates TRACE (or a window of it) and prints virtual seconds per CPU second; then how
that scales with the request rate (``--speed`` 1, 2, 4: arrivals compressed) and with the
number of backends (the embedded default's two engines copied to 4 and 8, round-robin, at
the same per-backend rate)::

    .venv/bin/python -m benchmarks.simulate_fidelity speed TRACE [--window 0:3600]

Live runs take each slice's real duration per policy; the live side runs in real time on a
shared machine, so run it on a quiet one.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from router.cli import default_config_path
from router.server.children import spawn_ready, stop_all

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "config" / "demo-capture.jsonl"
POLICIES = ("round-robin", "class-split", "adaptive", "cache-aware")
METRICS = (
    ("mean TTFT", "mean_ttft_ms", "ms"),
    ("P95 TTFT", "p95_ttft_ms", "ms"),
    ("mean TPOT", "mean_tpot_ms", "ms"),
    ("mean E2E", "mean_e2el_ms", "ms"),
    ("output throughput", "output_throughput", "tok/s"),
)


def _replay(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "turnout", "replay", *args], check=True, stdout=subprocess.DEVNULL
    )


def _runs(path: Path) -> dict[str, dict[str, Any]]:
    report = json.loads(path.read_text())
    return {str(r["policy"]): r for r in report["runs"]}


def with_cache_aware(path: Path) -> Path:
    """The embedded default with a ``cache-aware`` policy beside its own."""
    doc = yaml.safe_load(default_config_path().read_text())
    doc["policies"]["cache-aware"] = {"type": "cache-aware"}
    path.write_text(yaml.safe_dump(doc))
    return path


def error(live: float | None, simulated: float | None) -> float | None:
    """The simulator's relative error on one figure (None when live has none)."""
    return None if not live or simulated is None else simulated / live - 1


def fidelity(a: argparse.Namespace) -> None:
    """Live and simulated figures per trace, policy and metric, with the error."""
    a.out_dir.mkdir(parents=True, exist_ok=True)
    config = Path(a.config) if a.config else with_cache_aware(a.out_dir / "router.yaml")
    traces = [(str(CAPTURE), None, ["--speed", str(a.capture_speed)])]
    for spec in a.traces:
        path, _, window = spec.partition("@")
        traces.append((path, window or a.window, ["--sessions", "infer"]))
    argv = [sys.executable, "-m", "turnout", "serve", "--port", "0", "--config", str(config)]
    # its own batch store: another router on this machine may hold the default one
    env = {**os.environ, "XDG_DATA_HOME": str(a.out_dir / "data")}
    rows: list[tuple[str, str, str, float | None, float | None]] = []
    for n, (path, window, extra) in enumerate(traces):
        args = [path, *(["--window", window] if window else []), *extra]
        for name in a.policies:
            args += ["--policy", name]
        live, sim = a.out_dir / f"live-{n}.json", a.out_dir / f"simulated-{n}.json"
        if not (a.reuse_live and live.exists()):
            print(f"live replay of {path} [{window or 'all'}] through the router...", flush=True)
            proc, url = spawn_ready(argv, "turnout listening on", 120, env=env)
            try:
                _replay(*args, "--target", url, "--out", str(live), "--no-progress")
            finally:
                stop_all([proc], 30)
        print(f"simulating {path} [{window or 'all'}]...", flush=True)
        _replay("simulate", *args, "--config", str(config), "--out", str(sim))
        lv, sv = _runs(live), _runs(sim)
        label = Path(path).name + (f" [{window} s]" if window else "")
        for name in a.policies:
            lm, sm = lv[name]["overall"], sv[name]["overall"]
            for metric, key, _ in METRICS:
                rows.append((label, name, metric, lm.get(key), sm.get(key)))
    _print(rows, markdown=a.markdown)


def _print(rows: list[tuple[str, str, str, float | None, float | None]], *, markdown: bool) -> None:
    units = {m: u for m, _, u in METRICS}
    if markdown:
        print("| trace | policy | metric | live | simulated | error |")
        print("|---|---|---|---|---|---|")
    else:
        print(
            f"{'trace':34} {'policy':12} {'metric':18} {'live':>11} {'simulated':>11} {'error':>7}"
        )
    last = ("", "")
    for trace, policy, metric, x, y in rows:
        e = error(x, y)
        err = "-" if e is None else f"{e * 100:+.1f}%"
        unit = units[metric]
        lx, ly = f"{_num(x)} {unit}", f"{_num(y)} {unit}"
        shown = ("", "") if (trace, policy) == last else (trace, policy)
        last = (trace, policy)
        if markdown:
            print(f"| {shown[0]} | {shown[1]} | {metric} | {lx} | {ly} | {err} |")
        else:
            print(f"{shown[0]:34} {shown[1]:12} {metric:18} {lx:>11} {ly:>11} {err:>7}")
    worst = max((abs(e) for *_, x, y in rows if (e := error(x, y)) is not None), default=0.0)
    print(f"\nlargest error: {worst * 100:.1f}%")


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
    p.add_argument("trace", nargs="?", help="speed: the trace simulated")
    p.add_argument(
        "--trace",
        action="append",
        dest="traces",
        default=[],
        metavar="PATH[@START:END]",
        help="fidelity: a public trace beside the bundled capture (repeatable)",
    )
    p.add_argument("--window", default="0:120", help="START:END seconds of the trace")
    p.add_argument("--capture-speed", type=float, default=6.0)
    p.add_argument("--policy", action="append", dest="policies")
    p.add_argument("--config", help="router config (default: the embedded default)")
    p.add_argument("--markdown", action="store_true", help="fidelity: the table as Markdown")
    p.add_argument("--out-dir", type=Path, default=Path("out/fidelity"))
    p.add_argument(
        "--reuse-live", action="store_true", help="keep OUT_DIR/live-N.json from an earlier run"
    )
    a = p.parse_args(argv)
    if a.what == "fidelity":
        a.policies = a.policies or list(POLICIES)
        fidelity(a)
        return 0
    if a.trace is None:
        p.error("speed needs a TRACE")
    a.policies = a.policies or ["class-split", "adaptive"]
    speed(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

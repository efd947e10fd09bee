"""The replay part of `make demo`: the bundled capture under three policies, side by side.

Starts the embedded default (``turnout serve``: two emulated engines and the router), replays
config/demo-capture.jsonl (four minutes of mixed interactive and batch traffic, at --speed 6
so each run takes about 40 seconds) once per policy among round-robin, class-split and adaptive
that the router offers, prints the comparison table and writes report.json and report.html::

    .venv/bin/python -m benchmarks.replay_demo [--speed 6] [--out-dir out]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from router.server.children import spawn_ready, stop_all

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "config" / "demo-capture.jsonl"
WANTED = ("round-robin", "class-split", "adaptive")


def available_policies(router: str) -> list[str]:
    """The wanted policies the router lists, in the wanted order."""
    with urllib.request.urlopen(router + "/turnout/policies", timeout=10) as r:
        names = {p["name"] for p in json.load(r)}
    return [p for p in WANTED if p in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speed", type=float, default=6.0)
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    p.add_argument("--max-requests", type=int, help="cut the capture short (for a quick look)")
    a = p.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    argv_router = [sys.executable, "-m", "turnout", "serve", "--port", "0"]
    # The demo's batch store (the embedded default has one) stays in its own directory: a
    # `turnout serve` of the user's may hold the one in the user's data directory.
    env = {**os.environ, "XDG_DATA_HOME": str((a.out_dir / "data").resolve())}
    print("starting the embedded default (two emulated engines and the router)...", flush=True)
    proc, url = spawn_ready(argv_router, "turnout listening on", 120, env)
    try:
        policies = available_policies(url)
        print(f"router at {url}; replaying {CAPTURE.name} under {', '.join(policies)}", flush=True)
        report, page = a.out_dir / "report.json", a.out_dir / "report.html"
        cmd = [sys.executable, "-m", "turnout", "replay", str(CAPTURE), "--target", url]
        cmd += ["--speed", str(a.speed), "--out", str(report), "--html", str(page)]
        for name in policies:
            cmd += ["--policy", name]
        if a.max_requests:
            cmd += ["--max-requests", str(a.max_requests)]
        code = subprocess.run(cmd, check=False).returncode
        if code == 0:
            print(f"\nwrote {report} and {page} (open it in a browser)")
        return code
    finally:
        stop_all([proc], 30)


if __name__ == "__main__":
    sys.exit(main())

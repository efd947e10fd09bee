"""The replay part of `make demo`: the bundled capture, two policies and an A/A run, compared.

Starts the embedded default (``turnout serve``: two emulated engines and the router), replays
config/demo-capture.jsonl (four minutes of mixed interactive and batch traffic, at --speed 6
so each run takes about 40 seconds) under class-split and adaptive and, with ``--aa``, once
more under class-split for the noise floor, interleaved in blocks after a warm-up
(docs/replay.md), prints the verdict line and the tables and writes report.json and
report.html::

    .venv/bin/python -m benchmarks.replay_demo [--speed 6] [--out-dir out] [--policy P]...

Both engines are priced alike (an illustrative 40 USD an hour each, ``--price``), so the
cost figures compare how busy each policy kept them per output token.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from router.server.children import spawn_ready, stop_all

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "config" / "demo-capture.jsonl"
WANTED = ("class-split", "adaptive")
PRICES = ("vllm=40", "deepinfer=40")


def available_policies(router: str, wanted: list[str]) -> list[str]:
    """The wanted policies the router lists, in the wanted order."""
    with urllib.request.urlopen(router + "/turnout/policies", timeout=10) as r:
        names = {p["name"] for p in json.load(r)}
    return [p for p in wanted if p in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speed", type=float, default=6.0)
    p.add_argument("--out-dir", type=Path, default=Path("out"))
    p.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="the policies compared, the first the baseline (default: class-split, adaptive)",
    )
    p.add_argument("--max-requests", type=int, help="cut the capture short (for a quick look)")
    a = p.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    argv_router = [sys.executable, "-m", "turnout", "serve", "--port", "0"]
    print("starting the embedded default (two emulated engines and the router)...", flush=True)
    proc, url = spawn_ready(argv_router, "turnout listening on", 120)
    try:
        policies = available_policies(url, a.policies or list(WANTED))
        print(f"router at {url}; replaying {CAPTURE.name} under {', '.join(policies)}", flush=True)
        report, page = a.out_dir / "report.json", a.out_dir / "report.html"
        cmd = [sys.executable, "-m", "turnout", "replay", str(CAPTURE), "--target", url]
        cmd += ["--speed", str(a.speed), "--out", str(report), "--html", str(page), "--aa"]
        for name in policies:
            cmd += ["--policy", name]
        for price in PRICES:
            cmd += ["--price", price]
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

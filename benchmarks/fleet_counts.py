"""Instructions and simulated cache misses per request against the fleet's size, counted.

    python -m benchmarks.fleet_counts [--sizes 2,256] [--policies round-robin,pinned,class-split]
                                      [--requests 512]

benchmarks/fleet_size.py times the router's CPU per request, and on this two-core machine a
run's CPU time moves by more than the growth it is after (its A/A rows differ by up to 1.6x
between runs). This counts instead: valgrind's callgrind (Debian's ``valgrind``) runs one
router per size and policy in front of fleet_size's upstream and config, with instrumentation
off while it starts and is warmed up (two round-robin requests per backend, at least 128, so
that every backend's connection is open, then as many through the policy, so that its series
exist), then on for ``--requests`` closed-loop requests (fleet_size's 32 streams of 16
chunks) through the policy. Per request it prints the instructions executed, data reads and
writes, and the misses of a simulated 48 KiB L1 data cache and 1 MiB last-level cache (this
machine's per-core sizes): last-level misses are the memory a request reaches that the
requests before it did not keep warm, which is what grows with the fleet when the
instructions do not. The figures repeat within a few per cent between runs whatever else the
machine is doing; the kernel's side (sockets) is not counted.

Under valgrind a request takes tens of times longer, so at 256 backends a connection would sit
idle past the pool's 4 s limit (router.proxy.keepalive.IDLE_SECONDS) between two of its uses
and be reopened on most requests: the router here runs with that limit lifted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from benchmarks.fleet_size import CHUNKS, PATH, STREAMS, UPSTREAM_READY, _config, _urls
from benchmarks.proxy_overhead import _load
from router.server.children import spawn_ready

EVENTS = ("Ir", "Dr", "Dw", "D1mr", "D1mw", "DLmr", "DLmw")
COLUMNS = ("instructions", "data reads", "data writes", "L1d read misses", "L1d write misses",
           "LL read misses", "LL write misses")  # fmt: skip
CACHES = ("--D1=49152,12,64", "--LL=1048576,16,64", "--cache-sim=yes")
# The router's entry point with the pool's idle limit lifted (see the module docstring).
BOOT = (
    "import runpy\n"
    "from router.proxy.keepalive import ConnectionPool\n"
    "ConnectionPool.__init__.__defaults__ = (1e9,)\n"
    "runpy.run_module('turnout', run_name='__main__', alter_sys=True)\n"
)


def _counts(dump: Path) -> dict[str, int]:
    """The events and their totals of one callgrind dump."""
    text = dump.read_text(errors="replace")
    names = re.search(r"^events: (.*)$", text, re.M)
    totals = re.search(r"^(?:summary|totals): (.*)$", text, re.M)
    if names is None or totals is None:
        raise RuntimeError(f"no totals in {dump}")
    return dict(zip(names.group(1).split(), map(int, totals.group(1).split()), strict=False))


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def count(port: str, backends: int, policy: str, requests: int, tmp: Path) -> dict[str, float]:
    """Per request, the events of ``requests`` requests through ``policy`` at ``backends``."""
    out = tmp / f"{policy}-{backends}"
    argv = ["valgrind", "-q", "--tool=callgrind", "--instr-atstart=no", *CACHES,
            f"--callgrind-out-file={out}.%p", sys.executable, "-c", BOOT,
            "serve", "--config", str(_config(_urls(port, backends), tmp))]  # fmt: skip
    proc, url = spawn_ready(argv, "turnout listening on ", 600)
    try:
        warm = max(2 * backends, 128)
        headers = {"X-Turnout-Policy": policy}
        uvloop.run(_load(url + PATH, STREAMS, warm, CHUNKS, 0.0, True))
        # and through the policy, so its series of each backend exist before counting
        uvloop.run(_load(url + PATH, STREAMS, warm, CHUNKS, 0.0, True, headers=headers))
        _control("-i", "on", str(proc.pid))
        run = uvloop.run(_load(url + PATH, STREAMS, requests, CHUNKS, 0.0, True, headers=headers))
        _control("-d", str(proc.pid))
        _control("-i", "off", str(proc.pid))
    finally:
        proc.terminate()
        proc.wait(120)
    counts = _counts(Path(f"{out}.{proc.pid}.1"))
    return {event: counts.get(event, 0) / len(run.e2e) for event in EVENTS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="2,256", help="backend counts")
    ap.add_argument("--policies", default="round-robin,pinned,class-split", help="X-Turnout-Policy")
    ap.add_argument("--requests", type=int, default=512, help="requests counted per router")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not on the PATH (Debian: apt-get install valgrind)")
        return 1
    sizes = [int(s) for s in args.sizes.split(",")]
    argv_up = [sys.executable, "-m", "benchmarks.fleet_size", "--upstream-server", str(max(sizes))]
    up, port = spawn_ready(argv_up, UPSTREAM_READY, 120)
    print(f"{args.requests} requests counted per router, {STREAMS} closed-loop streams of "
          f"{CHUNKS} chunks; per request, under callgrind", flush=True)  # fmt: skip
    print("| policy | backends | " + " | ".join(COLUMNS) + " |")
    print("|---|---" + "|---" * len(COLUMNS) + "|")
    figures: dict[tuple[str, int], dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for policy in args.policies.split(","):
                for n in sizes:
                    got = figures[policy, n] = count(port, n, policy, args.requests, Path(tmp))
                    cells = " | ".join(f"{got[e]:,.0f}" for e in EVENTS)
                    print(f"| {policy} | {n:,} | {cells} |", flush=True)
    finally:
        up.terminate()
        up.wait(20)
    small, large = sizes[0], sizes[-1]
    print(f"\nat {large:,} backends against {small:,}:")
    for policy in args.policies.split(","):
        a, b = figures[policy, small], figures[policy, large]
        misses = (b["DLmr"] + b["DLmw"]) - (a["DLmr"] + a["DLmw"])
        print(f"  {policy:18} instructions {b['Ir'] / a['Ir']:5.3f}x, "
              f"last-level misses {misses:+,.0f} a request")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

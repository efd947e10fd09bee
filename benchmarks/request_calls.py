"""Python function calls per proxied request: the router's per-request work, counted in a
way the machine's load does not move.

    python -m benchmarks.request_calls [--requests 5000] [--top 15]

The bench upstream of benchmarks/proxy_overhead.py runs in its own process, the router (that
benchmark's config: one backend, the ``pinned`` policy, the access log on, its lines to
/dev/null here) in this process's event loop under cProfile, and the load (16 requests at a
time, non-streamed one-chunk answers, after a warm-up) in a child process, so that only the
router's work is counted. It prints the calls per request and the files that make the most
of them. CPU time per request moves by ±17% between identical runs on a shared machine
(docs/benchmarks.md); this count moves by less than one call, so it shows what a change to
the request path removed even where the CPU figures cannot.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
from collections import Counter
from pathlib import Path

import uvloop

from benchmarks.proxy_overhead import UPSTREAM_READY, _router_config
from router.app import STATE, build_app, listen_socket, serve
from router.config.parse import load_config
from router.observe.access import AccessLog
from router.server.children import spawn_ready

_LOAD = (
    "import sys, uvloop; from benchmarks.proxy_overhead import _load; "
    "uvloop.run(_load(sys.argv[1], 16, int(sys.argv[2]), 1, 0.0, stream=False))"
)
_ROOT = str(Path(__file__).resolve().parent.parent) + os.sep


async def _send(url: str, requests: int) -> None:
    """``requests`` from a child process (its own interpreter: not profiled here)."""
    load = await asyncio.create_subprocess_exec(sys.executable, "-c", _LOAD, url, str(requests))
    if await load.wait() != 0:
        raise RuntimeError("the load generator failed")


async def _profile(upstream: str, directory: Path, requests: int) -> pstats.Stats:
    app = build_app(load_config(_router_config(upstream, directory, access_log=True)))
    devnull = os.open(os.devnull, os.O_WRONLY)
    app[STATE].access_log = AccessLog(devnull)
    served = await serve(app, listen_socket("127.0.0.1", 0))
    url = served.url + "/v1/chat/completions"
    try:
        await _send(url, 500)  # warm-up: connections opened, series bound
        profile = cProfile.Profile()
        profile.enable()
        await _send(url, requests)
        profile.disable()
    finally:
        await served.runner.cleanup()
        os.close(devnull)
    return pstats.Stats(profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--top", type=int, default=15, help="files listed by their calls")
    args = ap.parse_args(argv)
    up, upstream = spawn_ready(
        [sys.executable, "-m", "benchmarks.proxy_overhead", "--upstream-server"], UPSTREAM_READY, 30
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stats = uvloop.run(_profile(upstream, Path(tmp), args.requests))
    finally:
        up.terminate()
        up.wait(10)
    by_file: Counter[str] = Counter()
    for (path, _, _), (_, calls, *_) in stats.stats.items():  # type: ignore[attr-defined]
        by_file[path.removeprefix(_ROOT) if path != "~" else "(built-in)"] += calls
    total = sum(by_file.values())
    print(f"{args.requests} non-streamed requests: {total / args.requests:.1f} calls a request")
    for path, calls in by_file.most_common(args.top):
        print(f"  {calls / args.requests:7.1f}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

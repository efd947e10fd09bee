"""What the access log costs per request: one line built, encoded and written, side by side
with the same request sampled out and with the log off.

    python -m benchmarks.access_log [--requests 200000] [--to /dev/null]

Each request runs the finish-time steps the router runs (router.proxy.exchange): the
sampling draw (``AccessLog.wanted``), and when drawn the line's dict as
``Exchange._access_line`` builds it, then ``AccessLog.write`` (orjson and one ``os.write``)
to ``--to`` (``/dev/null`` measures the router's side only; a pipe or file adds the kernel's).
Printed: microseconds per request for ``enabled`` (sample 1.0), ``sample 0.1`` and ``off``.
Whole-router figures are too noisy to show a cost this size: ``benchmarks.proxy_overhead
--chunks 1`` with and without ``--no-access-log`` differs by less than its run-to-run spread.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time

from router.config.model import AccessLogSettings
from router.observe.access import AccessLog


def _line(i: int) -> dict[str, object]:
    """A served streamed request's line, as the router writes it."""
    return {
        "ts": dt.datetime.fromtimestamp(time.time(), dt.UTC),
        "request_id": f"req-{i:032x}",
        "tenant": "e7a1d3a0de59a0de",
        "path": "/v1/chat/completions",
        "model": "deepseek-v4.1-flash",
        "stream": True,
        "class": "interactive",
        "policy": "adaptive",
        "backend": "vllm",
        "attempts": 1,
        "status": 200,
        "reason": "ok",
        "ttft_ms": 212.5 + i % 7,
        "e2e_ms": 4310.25 + i % 11,
        "prompt_tokens": 812,
        "completion_tokens": 377,
    }


def _per_request(log: AccessLog, settings: AccessLogSettings, requests: int) -> float:
    t0 = time.perf_counter()
    for i in range(requests):
        if log.wanted(settings):
            log.write(_line(i))
    return (time.perf_counter() - t0) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--to", default=os.devnull, help="where lines go (default: /dev/null)")
    args = ap.parse_args(argv)
    fd = os.open(args.to, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        log = AccessLog(fd)
        cases = [
            ("enabled", AccessLogSettings()),
            ("sample 0.1", AccessLogSettings(sample=0.1)),
            ("off", AccessLogSettings(enabled=False)),
        ]
        print(f"{args.requests} requests, lines to {args.to}")
        print(f"{'access_log':12} {'us per request':>15}")
        for name, settings in cases:
            _per_request(log, settings, min(args.requests, 10_000))  # warm up
            print(f"{name:12} {_per_request(log, settings, args.requests):>15.2f}", flush=True)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())

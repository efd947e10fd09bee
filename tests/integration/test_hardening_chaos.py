"""The chaos benchmark, shortened: faults on one backend at a time never fail a request
before its first byte, and every stream broken mid-way ends with an SSE error event."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.procs import ROOT

FAULT_KINDS = {"kill", "stall", "drop", "503", "429"}


def test_chaos_short() -> None:
    # --duration 0: one round of the five faults, 0.6 s each plus 0.6 s healthy after each
    # (about 11 s in all, most of it the ten emulator restarts). 0.6 s is three of the router's
    # 0.2 s health probes, so each fault still lasts past an ejection (2 failed probes), and
    # the load still sends thousands of requests through it.
    argv = [sys.executable, "-m", "benchmarks.chaos", "--duration", "0", "--phase", "0.6",
            "--concurrency", "8", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    fig = json.loads(out.decode().strip().splitlines()[-1])
    kinds = {f.split(":")[1] for f in fig["faults"]}
    assert kinds == FAULT_KINDS, fig["faults"]
    assert fig["sent"] > 100
    assert fig["failed_before_first_byte"] == 0, fig["first_byte_errors"]
    assert fig["broken_without_error_event"] == 0
    assert fig["failed_mid_stream"] > 0  # the drop fault did break streams, each with an event
    assert fig["succeeded"] + fig["failed_mid_stream"] == fig["sent"]
    assert fig["failovers"] > 0
    # Loose: leaking a buffer per request (thousands of them) would exceed it.
    assert fig["rss_end_kb"] - fig["rss_start_kb"] < 64 * 1024

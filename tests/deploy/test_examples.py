"""The examples a newcomer runs: the capture -> replay walkthrough end to end (which also runs
the OpenAI-client example), on loopback with emulated engines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT

# The client example adds one request that names its policy in headers, and one streamed
# to the Responses API.
REQUESTS = 3
EXTRA = 2
POLICIES = ["round-robin", "class-split", "adaptive"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_walkthrough(work: Path, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``bash examples/capture_replay.sh`` in its own process group, killed whole at the end."""
    env = {
        **os.environ,
        "BIN": str(Path(sys.executable).parent),
        "PORT": str(free_port()),
        "WORK": str(work),
        "REQUESTS": str(REQUESTS),
    }
    argv = ["bash", str(ROOT / "examples" / "capture_replay.sh")]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:  # the script's background router and emulators must be gone as well
            try:
                os.killpg(proc.pid, 0)
                leftover = True
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                leftover = False
            assert not leftover, "the walkthrough left processes running"


def test_capture_replay_walkthrough(tmp_path: Path) -> None:
    res = run_walkthrough(tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    captured = (tmp_path / "capture.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(captured) == REQUESTS + EXTRA
    lines = [json.loads(line) for line in captured]
    assert [line["url"] for line in lines].count("/v1/responses") == 1
    assert {line["route"]["class"] for line in lines} == {"interactive", "batch"}
    assert all(line["resp"]["status"] == 200 for line in lines)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert [run["policy"] for run in report["runs"]] == POLICIES
    for run in report["runs"]:
        assert run["overall"]["completed"] == len(captured)
        assert run["overall"]["failed"] == 0
    results = (tmp_path / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(results) == len(POLICIES) * len(captured)
    assert (tmp_path / "report.html").stat().st_size > 0
    assert "| Successful requests" in res.stdout

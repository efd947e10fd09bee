"""The live progress line appears on a terminal (a pty) and carries sent/done/failed/time."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.procs import ROOT, start_emulator
from turnout.common.capture import CaptureRecord, dump_line


def test_progress_line_on_a_terminal(tmp_path: Path) -> None:
    cap = tmp_path / "cap.jsonl"
    body = {
        "model": "deepseek-v4.1-flash",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    with cap.open("wb") as f:
        for i in range(12):
            rec = CaptureRecord(f"r{i}", "/v1/chat/completions", body, t_offset_ms=i * 150.0)
            f.write(dump_line(rec))
    with start_emulator("vllm", time_scale=50) as emu:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnout", "replay", str(cap), "--target", emu.url],
            cwd=ROOT,
            stdout=slave,
            stderr=subprocess.DEVNULL,
        )
        os.close(slave)
        out = b""
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(master)
    text = out.decode(errors="replace")
    pattern = r"\[target\] sent (\d+)\s+done (\d+)\s+failed (\d+)\s+elapsed\s+[\d.]+s"
    lines = re.findall(pattern + r" / planned ([\d.]+)s", text)
    assert lines, text
    assert lines[-1][:3] == ("12", "12", "0")  # the final line shows the finished run
    assert lines[-1][3] == f"{11 * 0.15:.1f}"  # 11 gaps of 150 ms
    assert "\r" in text and "Successful requests" in text

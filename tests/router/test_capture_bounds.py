"""The capture writer's bounds: its queue in bytes, a torn line cut, a killed sink replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from router.config.model import CaptureSettings
from tests.replay.test_capture_writer import _Counts, _entry, _Finished, _lines, _writer
from turnout.common.capture import parse_line


def _big(rid: str, chars: int) -> _Finished:
    return _entry(rid, {"model": "m", "prompt": "x" * chars})


def _ids(path: Path) -> list[str]:
    return [parse_line(line).custom_id for line in _lines(path)]


async def _until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_the_queue_is_bounded_in_bytes_until_the_lines_are_piped(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(path), queue_bytes=1_000_000), counts)
    await w.start()
    try:
        for i in range(10):  # synchronous burst: the writer task gets no chance to drain
            w.record(_big(f"r{i}", 300_000))
        assert counts.dropped == ["queue_bytes"] * 7
        await _until(lambda: path.exists() and len(_lines(path)) == 3)
        # Once piped, their bytes are free again: a request gets in.
        deadline = time.monotonic() + 10
        while True:
            w.record(_big("late", 300_000))
            if len(counts.dropped) == 7:
                break
            assert counts.dropped.pop() == "queue_bytes" and time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        await w.aclose()
    assert counts.dropped == ["queue_bytes"] * 7
    assert _ids(path) == ["r0", "r1", "r2", "late"]


async def test_a_line_left_torn_is_cut_before_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    whole = b'{"custom_id":"old","method":"POST","url":"/v1/completions","body":{}}\n'
    path.write_bytes(whole + b'{"custom_id":"torn","method":"PO')  # a killed sink's last write
    w = _writer(CaptureSettings(path=str(path)))
    await w.start()
    w.record(_entry("new"))
    await w.aclose()
    assert _ids(path) == ["old", "new"]
    path.write_bytes(b'{"custom_id":"torn","method":"PO')  # torn and alone in the file
    w = _writer(CaptureSettings(path=str(path)))
    await w.start()
    await w.aclose()
    assert path.read_bytes() == b""


def _sink_pid(path: Path) -> int:
    """The sink process writing ``path`` (a child of this process)."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"router.observe.sink" in cmdline and str(path).encode() in cmdline:
                return int(pid)
    raise AssertionError("no sink")


async def test_a_killed_sink_is_replaced_and_loses_only_what_it_held(tmp_path: Path) -> None:
    """Lines in the dead sink's pipe and hands are lost (about 1 MiB and 64 KiB, documented),
    those the writer could not pipe are counted as sink_gone, and every later one is written
    by a new sink; the file holds whole lines only, each once, in order."""
    path = tmp_path / "cap.jsonl"
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(path)), counts)
    await w.start()
    size = 32 * 1024
    try:
        for i in range(100):
            w.record(_big(f"a{i:03}", size))
        await _until(lambda: path.exists() and len(_lines(path)) >= 10)
        os.kill(_sink_pid(path), signal.SIGKILL)
        for i in range(100):
            w.record(_big(f"b{i:03}", size))
            await asyncio.sleep(0.002)  # several batches: a write meets the dead pipe
        await _until(lambda: any(r == "sink_gone" for r in counts.dropped))
        await asyncio.sleep(0.2)
        for i in range(20):
            w.record(_big(f"c{i:03}", size))
    finally:
        await w.aclose()
    ids = _ids(path)  # each line parses: none is torn
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [i for i in ids if i.startswith("c")] == [f"c{i:03}" for i in range(20)]
    lost = 200 - len([i for i in ids if i[0] in "ab"]) - counts.dropped.count("sink_gone")
    assert set(counts.dropped) == {"sink_gone"}
    pipe = 64 * 1024  # Linux's default pipe capacity
    assert 0 <= lost * size <= (1 << 20) + pipe + size, lost  # its read, its pipe, a held line

"""The router's capture writer: schema, allow-list, redaction, sampling, drops, rotation."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.capture import CaptureRecord, Observed, Response, Route, iso_utc, parse_line
from common.tokens import count_chat
from router.config.model import CaptureSettings
from router.observe.capture import CaptureWriter
from router.observe.redact import hash_text, redact

_BODY = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello, world! What's 2+2?"},
    ],
    "max_tokens": 5,
    "stream": True,
}


@dataclass(frozen=True)
class _Finished:
    """A finished request as the writer sees it (the router's is router.proxy.exchange)."""

    request_id: str
    arrival: float
    body: Mapping[str, Any]

    def capture_record(self, t0: float) -> CaptureRecord:
        return CaptureRecord(
            custom_id=self.request_id,
            url="/v1/chat/completions",
            body=self.body,
            t_offset_ms=(self.arrival - t0) * 1000.0,
            ts=iso_utc(time.time()),
            headers={
                "Authorization": "Bearer sk-secret",
                "Cookie": "a=b",
                "X-Request-Class": "interactive",
                "User-Agent": "t",
                "X-Other": "no",
            },
            route=Route("adaptive", "interactive", "vllm", 0),
            resp=Response(200, True, "length", None, 5, None),
            obs=Observed(ttft_ms=100.0, tpot_ms=10.0, e2e_ms=150.0),
        )


def _entry(rid: str, body: Mapping[str, Any] = _BODY) -> _Finished:
    return _Finished(rid, time.monotonic(), body)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


async def test_lines_follow_the_schema_and_the_allow_list(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    headers = ("x-request-class", "user-agent", "authorization", "cookie")
    w = CaptureWriter(CaptureSettings(path=str(path), headers=headers), on_drop=lambda: None)
    await w.start()
    for i in range(3):
        w.record(_entry(f"r{i}"))
    await w.aclose()
    lines = _lines(path)
    assert len(lines) == 3
    doc = orjson.loads(lines[0])
    assert list(doc)[:4] == ["custom_id", "method", "url", "body"]
    assert doc["body"] == _BODY
    assert doc["headers"] == {"x-request-class": "interactive", "user-agent": "t"}
    assert b"sk-secret" not in path.read_bytes() and b"a=b" not in path.read_bytes()
    rec = parse_line(lines[2])
    assert rec.custom_id == "r2" and rec.route is not None and rec.route.backend == "vllm"
    assert rec.resp is not None and rec.resp.completion_tokens == 5
    assert rec.obs is not None and rec.obs.ttft_ms == pytest.approx(100.0)
    assert rec.t_offset_ms is not None and rec.t_offset_ms >= 0
    assert rec.ts is not None and rec.ts.endswith("Z")


def test_hash_redaction_keeps_lengths_and_token_counts() -> None:
    text = "Hello, world! What's 2+2?"
    hashed = hash_text(text)
    assert hashed != text and len(hashed) == len(text)
    assert hash_text(text) == hashed
    body = redact(dict(_BODY), "hash")
    assert count_chat(body["messages"]) == count_chat(_BODY["messages"])  # type: ignore[arg-type]
    assert "world" not in orjson.dumps(body).decode()
    assert body["max_tokens"] == 5


async def test_drop_redaction_keeps_parameters_and_size(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(CaptureSettings(path=str(path), redaction="drop"), on_drop=lambda: None)
    await w.start()
    w.record(_entry("r0"))
    await w.aclose()
    rec = parse_line(_lines(path)[0])
    assert "messages" not in rec.body and rec.body["max_tokens"] == 5
    assert rec.resp is not None
    assert rec.resp.prompt_tokens == count_chat(_BODY["messages"])  # type: ignore[arg-type]


async def test_sampling_is_by_request_id(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(CaptureSettings(path=str(path), sample_rate=0.3), on_drop=lambda: None)
    await w.start()
    ids = [f"req-{i}" for i in range(400)]
    for rid in ids:
        w.record(_entry(rid))
    await w.aclose()
    kept = {parse_line(line).custom_id for line in _lines(path)}
    expected = {r for r in ids if zlib.crc32(r.encode()) < int(0.3 * 2**32)}
    assert kept == expected
    assert 60 < len(kept) < 180


async def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    drops: list[int] = []
    w = CaptureWriter(
        CaptureSettings(path=str(path), queue_size=4), on_drop=lambda: drops.append(1)
    )
    await w.start()
    for i in range(10):  # synchronous burst: the writer task gets no chance to drain
        w.record(_entry(f"r{i}"))
    await w.aclose()
    assert len(drops) == 6
    assert len(_lines(path)) == 4


async def test_rotation_keeps_every_line(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(CaptureSettings(path=str(path), rotate_bytes=2000), on_drop=lambda: None)
    await w.start()
    for i in range(20):
        w.record(_entry(f"r{i}"))
        if i % 5 == 0:
            await asyncio.sleep(0.01)
    await w.aclose()
    files = sorted(tmp_path.iterdir())
    assert len(files) > 2
    ids = []
    for f in files:
        assert f.stat().st_size <= 2000
        ids += [parse_line(line).custom_id for line in _lines(f)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(20))
    # the newest lines are in the unsuffixed file, the oldest in the highest suffix
    assert parse_line(_lines(path)[-1]).custom_id == "r19"


_KILL_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, time
    sys.path.insert(0, {root!r})
    from router.observe.capture import CaptureWriter
    from router.config.model import CaptureSettings
    from tests.replay.test_capture_writer import _entry

    async def main() -> None:
        w = CaptureWriter(CaptureSettings(path=sys.argv[1]), on_drop=lambda: None)
        await w.start()
        print("writing", flush=True)
        i = 0
        while True:
            for _ in range(50):
                w.record(_entry(f"r{{i}}"))
                i += 1
            await asyncio.sleep(0.001)

    asyncio.run(main())
    """
)


def test_kill_9_leaves_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "w.py"
    script.write_text(_KILL_SCRIPT.format(root=root))
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 200_000):
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    # the sink process finishes the lines it already has, then exits on EOF
    sizes = [-1, -2]
    for _ in range(100):
        if sizes[-1] == sizes[-2]:
            break
        time.sleep(0.1)
        sizes.append(path.stat().st_size)
    data = path.read_bytes()
    assert len(data) >= 200_000
    assert data.endswith(b"\n")
    ids = [parse_line(line).custom_id for line in data.splitlines()]
    assert ids == [f"r{i}" for i in range(len(ids))]


async def test_lines_reach_the_file_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(CaptureSettings(path=str(path)), on_drop=lambda: None)
    await w.start()
    try:
        w.record(_entry("r0"))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not (path.exists() and path.stat().st_size):
            await asyncio.sleep(0.01)
        assert parse_line(_lines(path)[0]).custom_id == "r0"  # no close, no flush call
    finally:
        await w.aclose()


async def test_an_unwritable_path_fails_at_start(tmp_path: Path) -> None:
    w = CaptureWriter(
        CaptureSettings(path=str(tmp_path / "missing" / "cap.jsonl")), on_drop=lambda: None
    )
    with pytest.raises(FileNotFoundError):
        await w.start()


async def test_two_workers_share_one_rotating_file(tmp_path: Path) -> None:
    """`router serve --workers 2`: two writers (two sinks) on one path, rotation included."""
    path = tmp_path / "cap.jsonl"
    settings = CaptureSettings(path=str(path), rotate_bytes=3000)
    writers = [CaptureWriter(settings, on_drop=lambda: None) for _ in range(2)]
    for w in writers:
        await w.start()
    for i in range(60):
        writers[i % 2].record(_entry(f"r{i}"))
        if i % 4 == 0:
            await asyncio.sleep(0.005)
    for w in writers:
        await w.aclose()
    ids = []
    for f in tmp_path.iterdir():
        assert f.stat().st_size <= 3000
        ids += [parse_line(line).custom_id for line in _lines(f)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(60))


def test_hash_redaction_reaches_tool_calls_and_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "secret plan"}]},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "secret"}'},
                    }
                ],
            },
        ],
    }
    out = orjson.dumps(redact(body, "hash"))
    assert b"secret" not in out
    assert b'"role":"assistant"' in out and b'"type":"text"' in out and b'"id":"call_1"' in out

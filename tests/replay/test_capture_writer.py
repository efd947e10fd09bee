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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.config.model import CaptureSettings, Redaction
from router.observe.capture import CaptureWriter
from router.observe.redact import hash_text, redact
from turnout.common.capture import CaptureRecord, Observed, Response, Route, iso_utc, parse_line
from turnout.common.tokens import count_chat

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

    @property
    def capture_bytes(self) -> int:
        return len(repr(self.body))  # about its size as JSON

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


KEY = b"capture-test-key-0123456789abcdef"


@dataclass
class _Counts:
    """What a writer reported: reasons of dropped and of degraded (body replaced) requests."""

    dropped: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)


def _writer(settings: CaptureSettings, counts: _Counts | None = None) -> CaptureWriter:
    c = counts if counts is not None else _Counts()
    return CaptureWriter(settings, on_drop=c.dropped.append, on_degraded=c.degraded.append)


async def test_lines_follow_the_schema_and_the_allow_list(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    headers = ("x-request-class", "user-agent", "authorization", "cookie")
    w = _writer(CaptureSettings(path=str(path), headers=headers))
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
    hashed = hash_text(text, KEY)
    assert hashed != text and len(hashed) == len(text)
    assert hash_text(text, KEY) == hashed
    body = redact(dict(_BODY), "hash", KEY)
    assert count_chat(body["messages"]) == count_chat(_BODY["messages"])  # type: ignore[arg-type]
    assert "world" not in orjson.dumps(body).decode()
    assert body["max_tokens"] == 5


async def test_lines_hash_with_the_configured_key_in_every_writer(tmp_path: Path) -> None:
    """`--workers`: writers given one key write one filler; another key, another filler."""
    contents = []
    for i, key in enumerate((KEY, KEY, KEY[::-1])):
        path = tmp_path / f"cap{i}.jsonl"
        w = _writer(CaptureSettings(path=str(path), redaction="hash", hash_key=key))
        await w.start()
        w.record(_entry("r0"))
        await w.aclose()
        contents.append(parse_line(_lines(path)[0]).body["messages"])
    assert contents[0] == contents[1] != contents[2]
    assert "terse" not in str(contents)


async def test_drop_redaction_keeps_parameters_and_size(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = _writer(CaptureSettings(path=str(path), redaction="drop"))
    await w.start()
    w.record(_entry("r0"))
    await w.aclose()
    rec = parse_line(_lines(path)[0])
    assert "messages" not in rec.body and rec.body["max_tokens"] == 5
    assert rec.resp is not None
    assert rec.resp.prompt_tokens == count_chat(_BODY["messages"])  # type: ignore[arg-type]


async def test_sampling_is_by_a_keyed_hash_of_the_request_id(tmp_path: Path) -> None:
    ids = [f"req-{i}" for i in range(400)]
    kept = []
    for i, key in enumerate((KEY, KEY, KEY[::-1])):
        path = tmp_path / f"cap{i}.jsonl"
        w = _writer(CaptureSettings(path=str(path), sample_rate=0.3, hash_key=key))
        await w.start()
        for rid in ids:
            w.record(_entry(rid))
        await w.aclose()
        kept.append({parse_line(line).custom_id for line in _lines(path)})
    assert kept[0] == kept[1] != kept[2]  # one key: the same id is in or out everywhere
    assert 60 < len(kept[0]) < 180


def test_a_client_cannot_choose_ids_that_are_always_sampled(tmp_path: Path) -> None:
    """Ids that an unkeyed hash (crc32, as before) would keep are kept at the sample rate."""
    threshold = int(0.3 * 2**32)
    chosen = [r for r in (f"pick-{i}" for i in range(2000)) if zlib.crc32(r.encode()) < threshold]
    for key in (None, KEY):
        w = _writer(CaptureSettings(path=str(tmp_path / "c.jsonl"), sample_rate=0.3, hash_key=key))
        kept = sum(w.sampled(r) for r in chosen)
        assert 0.15 * len(chosen) < kept < 0.45 * len(chosen)


async def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(path), queue_size=4), counts)
    await w.start()
    for i in range(10):  # synchronous burst: the writer task gets no chance to drain
        w.record(_entry(f"r{i}"))
    await w.aclose()
    assert counts.dropped == ["queue_full"] * 6
    assert len(_lines(path)) == 4


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("mode", ["none", "hash", "drop"])
async def test_a_body_too_deep_to_encode_is_written_replaced_and_counted(
    tmp_path: Path, mode: Redaction
) -> None:
    path = tmp_path / "cap.jsonl"
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(path), redaction=mode), counts)
    await w.start()
    w.record(_entry("deep", {**_BODY, "stop": _nested(300)}))
    w.record(_entry("fine"))
    await w.aclose()
    deep, fine = (parse_line(line) for line in _lines(path))
    assert deep.custom_id == "deep" and fine.custom_id == "fine"
    assert deep.body == {"model": "m", "_turnout": "body not encodable"}
    assert deep.resp is not None  # the rest of the record stays, and the prompt's size
    assert deep.resp.prompt_tokens == count_chat(_BODY["messages"])  # type: ignore[arg-type]
    assert deep.route is not None and deep.route.backend == "vllm"
    assert counts.degraded == ["unencodable"] and counts.dropped == []


async def test_text_that_is_not_utf8_is_written_replaced_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(path)), counts)
    await w.start()
    w.record(_entry("bad\udcff", {"model": "m", "prompt": "a\ud800b"}))
    await w.aclose()
    (rec,) = (parse_line(line) for line in _lines(path))
    assert rec.custom_id == "bad?" and rec.body["_turnout"] == "body not encodable"
    assert counts.degraded == ["unencodable"]


async def test_a_gone_sink_counts_what_it_loses(tmp_path: Path) -> None:
    counts = _Counts()
    w = _writer(CaptureSettings(path=str(tmp_path / "cap.jsonl")), counts)
    await w.start()
    proc = w._proc  # the sink process; killing it is what a crash of it would do
    assert proc is not None
    proc.kill()
    proc.wait()
    w.record(_entry("r0"))
    await w.aclose()
    assert counts.dropped == ["sink_gone"]
    w.record(_entry("r1"))  # after close
    assert counts.dropped == ["sink_gone", "not_running"]


async def test_rotation_keeps_every_line(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    w = _writer(CaptureSettings(path=str(path), rotate_bytes=2000))
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
    from router.config.model import CaptureSettings
    from tests.replay.test_capture_writer import _entry, _writer

    async def main() -> None:
        w = _writer(CaptureSettings(path=sys.argv[1]))
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
    w = _writer(CaptureSettings(path=str(path)))
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
    w = _writer(CaptureSettings(path=str(tmp_path / "missing" / "cap.jsonl")))
    with pytest.raises(FileNotFoundError):
        await w.start()


async def test_two_workers_share_one_rotating_file(tmp_path: Path) -> None:
    """`turnout serve --workers 2`: two writers (two sinks) on one path, rotation included."""
    path = tmp_path / "cap.jsonl"
    settings = CaptureSettings(path=str(path), rotate_bytes=3000)
    writers = [_writer(settings) for _ in range(2)]
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
    out = orjson.dumps(redact(body, "hash", KEY))
    assert b"secret" not in out and b"call_1" not in out and b"lookup" not in out
    assert b'"role":"assistant"' in out and b'"type":"text"' in out
    assert b'"type":"function"' in out

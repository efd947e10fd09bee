"""A client that goes away mid-stream, or before the answer's headers (a hedge's losing copy,
a client that gives up while its request waits), is an expected end for the emulator, not an
error."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

from tests.procs import metric, start_emulator, wait_for

BODY = (
    b'{"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"x"}],'
    b'"max_tokens":2000,"stream":true,"ignore_eos":true}'
)


def _posted(url: str, body: bytes) -> socket.socket:
    """A raw connection to ``url`` that has sent ``body`` to /v1/chat/completions (the
    caller closes it, its own way)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    s.sendall(head.encode() + body)
    return s


def _cut(url: str, reset: bool) -> None:
    """Read a few events of a long stream, then close: with an RST (``reset``, as the
    router's abort of an upstream sends) or an orderly FIN."""
    with _posted(url, BODY) as s:
        got = b""
        while got.count(b"data:") < 5:
            data = s.recv(65536)
            assert data, "the emulator ended the stream early"
            got += data
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_cut_streams_free_their_slots_and_log_nothing(tmp_path: Path) -> None:
    log = tmp_path / "emulator.log"
    with start_emulator("vllm", time_scale=50, stderr=log) as emu:
        # At once, so that resets meet handlers in the middle of their writes.
        threads = [threading.Thread(target=_cut, args=(emu.url, i % 2 == 0)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        running = "vllm:num_requests_running"
        assert wait_for(lambda: metric(emu.url, running, required=True) == 0)
    text = log.read_text()
    assert "Traceback" not in text and "Error handling request" not in text, text


def _leave_early(url: str, stream: bool, reset: bool, after: float) -> bool:
    """Send a request whose long prompt keeps it in prefill, and close ``after`` seconds later
    (with an RST if ``reset``); whether nothing of the answer had come by then."""
    body = json.dumps(
        {
            "model": "deepseek-v4.1-flash",
            "messages": [{"role": "user", "content": "word " * 3000}],
            "max_tokens": 50,
            "stream": stream,
        }
    ).encode()
    with _posted(url, body) as s:
        time.sleep(after)
        s.setblocking(False)
        try:
            early = not s.recv(1)  # b"": the emulator closed; an error: nothing yet
        except BlockingIOError:
            early = True
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return early


def test_clients_gone_before_the_headers_free_their_slots_and_log_nothing(
    tmp_path: Path,
) -> None:
    log = tmp_path / "emulator.log"
    with start_emulator("vllm", stderr=log) as emu:
        # A stream's headers go out as soon as it is read (a few ms), a JSON answer's after
        # its whole generation (about a second): streams are closed at once, JSON answers
        # while in prefill; with an RST or a FIN.
        cases = [(i % 2 == 0, i % 4 < 2, 0.0 if i % 2 == 0 else 0.01 * (i % 5)) for i in range(20)]
        early = [False] * len(cases)

        def leave(i: int) -> None:
            early[i] = _leave_early(emu.url, *cases[i])

        threads = [threading.Thread(target=leave, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Each JSON answer was cut before its headers, and most streams (one whose headers
        # came first is cut mid-stream, as the test above does).
        assert all(e for (stream, _, _), e in zip(cases, early, strict=True) if not stream)
        assert sum(e for (stream, _, _), e in zip(cases, early, strict=True) if stream) >= 5

        def idle() -> bool:
            gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
            return all(metric(emu.url, g, required=True) == 0 for g in gauges)

        assert wait_for(idle, 30)
    text = log.read_text()
    assert "Traceback" not in text and "Error handling request" not in text, text

"""A client that goes away mid-stream is an expected end for the emulator, not an error."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

from tests.procs import metric, start_emulator, wait_for

BODY = (
    b'{"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"x"}],'
    b'"max_tokens":2000,"stream":true,"ignore_eos":true}'
)


def _cut(url: str, reset: bool) -> None:
    """Read a few events of a long stream, then close: with an RST (``reset``, as the
    router's abort of an upstream sends) or an orderly FIN."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        )
        s.sendall(head.encode() + BODY)
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

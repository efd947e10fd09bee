"""A client that sends its request and then shuts down its sending side (a half-close, which
HTTP/1.1 allows: it can still read) gets its answer, from a real router process in front of
an emulator, on both of the router's HTTP servers (issue 26). Before, the router took the
half-close for a departure and cancelled the request: the client read nothing. (A close once
the answer has begun, or a while after the request, still cancels it at once: here, and in
tests/integration/test_router_failover.py and tests/router/test_wire.py.)"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import orjson
import pytest

from router.server.wire import HALF_CLOSE_SECONDS
from tests.procs import Process, start_emulator, wait_for
from tests.router.harness import base_config, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with start_emulator("vllm", time_scale=50) as emu:
        doc = base_config([("a", "vllm", emu.url)])
        doc["backends"][0]["forward_headers"] = ["X-Emulator-Fault"]
        with start_router(write_config(tmp_path_factory.mktemp("half"), doc)) as proc:
            yield proc


def _chat(stream: bool) -> bytes:
    doc = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return orjson.dumps({**doc, "stream": stream})


# The engine waits before its answer, so the half-close surely comes first.
STALL = b"X-Emulator-Fault: stall=0.5\r\n"


def _post(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"%bContent-Length: %d\r\n\r\n%b" % (STALL, len(body), body)
    )


REQUESTS = {
    "lean": _post(_chat(False)),
    "lean, streamed": _post(_chat(True)),
    "chunked: aiohttp's": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"%bTransfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n"
        % (STALL, len(_chat(False)), _chat(False))
    ),
    "another route: aiohttp's": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
}


def half_closed(router: Process, request: bytes) -> bytes:
    """Send ``request``, shut the sending side, read until the router closes."""
    url = urlsplit(router.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while data := sock.recv(65536):
            received += data
        return received


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_half_closed_client_gets_its_whole_answer(router: Process, name: str) -> None:
    received = half_closed(router, REQUESTS[name])
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), received[:200]
    if name == "another route: aiohttp's":
        assert orjson.loads(body)["data"][0]["id"] == MODEL
    elif name == "lean, streamed":
        assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the stream's last chunk
    else:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert orjson.loads(body[:length])["choices"][0]["message"]["content"]


def test_a_client_that_ends_its_sending_later_has_given_up(router: Process) -> None:
    """Past HALF_CLOSE_SECONDS after its request, the end of a client's sending is taken for
    it leaving (a close looks the same), as before: the request is cancelled, not answered
    when the engine is done with it."""
    body = _chat(False)
    held = _post(body).replace(b"stall=0.5", b"stall=30")
    url = urlsplit(router.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(held)
        time.sleep(HALF_CLOSE_SECONDS + 0.5)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536) == b""  # closed, well before the engine would answer
    assert wait_for(lambda: get(router.url + "/turnout/backends").json()[0]["inflight"] == 0)


def test_a_half_close_with_nothing_sent_closes_the_connection(router: Process) -> None:
    assert half_closed(router, b"") == b""  # at once, not after the idle limit (75 s)

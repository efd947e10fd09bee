"""Edge cases of router/proxy/connection.py, the router's keep-alive HTTP/1.1 client.

Every case talks to a raw asyncio server on 127.0.0.1 that writes scripted bytes, so the
response framing (splits, extensions, trailers, early closes, garbage) is exactly what the
test says. The main cases run again under uvloop at the end, the loop the router runs on.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import socket
import time
from collections.abc import Callable, Coroutine
from contextlib import closing

import pytest
import uvloop

from router.config.model import LimitSettings
from router.proxy.connection import (
    MAX_HEAD_BYTES,
    ProtocolError,
    ResponseHead,
    UpstreamError,
    UpstreamTimeout,
)
from router.proxy.keepalive import ConnectionPool
from router.proxy.origin import Origin, request_head, split_url
from tests.router.rawserver import (
    BODY,
    CHUNKED,
    CHUNKED_CUT,
    EVENTS,
    OK,
    Backend,
    Peer,
    answer_each,
    chunk,
    start,
    until,
)

IDLE = LimitSettings().upstream_idle_seconds  # the default `limits` keeps an upstream idle

# -- 1. keep-alive --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "connections"),
    [
        (OK, 1),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 1),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 2),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", 2),
    ],
    ids=["http11", "http10-keep-alive", "connection-close", "http10"],
)
async def test_keep_alive_reuse_follows_the_response(response: bytes, connections: int) -> None:
    async with Backend(answer_each(response)) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            used = []
            for _ in range(2):
                conn = await start(pool, backend.origin)
                assert (await conn.head()).status == 200
                assert await conn.read() == b"ok"
                assert conn.reusable is (connections == 1)
                pool.release(conn)
                used.append(conn)
            assert (used[0] is used[1]) is (connections == 1)
            await until(lambda: len(backend.requests) == 2)
    assert backend.accepted == connections
    for request in backend.requests:  # each request arrived whole, framed by its length
        assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert request.endswith(b"\r\n\r\n" + BODY)


# -- 2. chunked framing ---------------------------------------------------------------------


async def test_chunked_body_split_byte_by_byte_reaches_the_sink_whole() -> None:
    framed = (
        chunk(EVENTS[0], b";foo=bar")
        + chunk(EVENTS[1] + EVENTS[2])
        + b"0\r\nX-Checksum: 1234\r\n\r\n"
    )
    cut = len(EVENTS[0]) // 2
    half = framed.index(EVENTS[0]) + cut  # framing bytes up to mid-way into the first event
    pieces: list[bytes] = []
    at_half: list[bytes] = []

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED)
        for i in range(len(framed)):
            await peer.send(framed[i : i + 1])
            await asyncio.sleep(0)  # a loop turn: the client reads each byte on its own
            if i + 1 == half:
                # The first event, cut in two, must reach the client as just its first part.
                await until(lambda: sum(map(len, pieces)) >= cut)
                at_half.append(b"".join(pieces))
        await answer_each(OK)(peer)

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            head = await conn.head()
            assert head.headers["Transfer-Encoding"] == "chunked"
            conn.stream(pieces.append)
            await asyncio.wait_for(conn.finished(), 5)
            assert at_half == [EVENTS[0][:cut]]
            assert b"".join(pieces) == b"".join(EVENTS)  # no sizes, extension or trailer
            assert len(pieces) > len(EVENTS)
            assert conn.reusable
            pool.release(conn)
            # The trailer was consumed exactly: the next exchange parses on the same socket.
            again = await start(pool, backend.origin)
            assert again is conn
            assert await again.read() == b"ok"
            pool.release(again)
    assert backend.accepted == 1


# -- 3./4. Content-Length and read-to-EOF bodies --------------------------------------------


@pytest.mark.parametrize(("limit", "reused"), [(None, True), (10, True), (4, False)])
async def test_read_with_a_limit(limit: int | None, reused: bool) -> None:
    response = b"HTTP/1.1 503 Busy\r\nContent-Length: 10\r\n\r\n0123456789"
    async with Backend(answer_each(response)) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            assert (await conn.head()).status == 503
            assert await conn.read(limit) == b"0123456789"[:limit]
            assert conn.reusable is reused
            pool.release(conn)
            again = await start(pool, backend.origin)
            assert (again is conn) is reused
            assert await again.read() == b"0123456789"
            pool.release(again)
    assert backend.accepted == (1 if reused else 2)


@pytest.mark.parametrize("limit", [64, 100])
async def test_read_limit_ends_an_endless_body_and_frees_the_backend(limit: int) -> None:
    gone = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 500 Oops\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 100)
        await peer.client_gone()  # the rest never comes: only the limit can end the read
        gone.set()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            body = await asyncio.wait_for(conn.read(limit), 2)
            assert body == b"x" * limit
            assert not conn.reusable
            pool.release(conn)
            await asyncio.wait_for(gone.wait(), 2)  # released unfinished: closed at once


async def test_connection_idle_too_long_is_not_handed_out() -> None:
    async with Backend(answer_each(OK)) as backend:
        with closing(ConnectionPool(idle_seconds=0.05)) as pool:
            first = await start(pool, backend.origin)
            assert await first.read() == b"ok"
            pool.release(first)
            await until(lambda: time.monotonic() - first.idle_since > 0.06)
            second = await start(pool, backend.origin)
            assert second is not first and await second.read() == b"ok"
            assert not first.reusable  # closed on the way, not left open
            pool.release(second)
    assert backend.accepted == 2


async def test_forget_closes_a_departed_backends_idle_connections_and_sweeps_stale_ones() -> None:
    async with Backend(answer_each(OK)) as gone, Backend(answer_each(OK)) as stays:
        with closing(ConnectionPool(idle_seconds=0.05)) as pool:
            left, stale = await start(pool, gone.origin), await start(pool, stays.origin)
            for conn in (left, stale):
                assert await conn.read() == b"ok"
                pool.release(conn)
            await until(lambda: time.monotonic() - stale.idle_since > 0.06)
            url = f"http://{gone.origin.host}:{gone.origin.port}"
            pool.forget(url, None)
            await until(lambda: not left.reusable and not stale.reusable)
            fresh = await start(pool, stays.origin)
            assert fresh is not stale and await fresh.read() == b"ok"
            pool.release(fresh)


@pytest.mark.parametrize("consume", ["read", "stream"])
async def test_body_without_length_or_chunking_ends_at_eof(consume: str) -> None:
    parts = (b"first part, ", b"second part")

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + parts[0])
        await asyncio.sleep(0)
        await peer.send(parts[1])
        peer.writer.close()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            if consume == "read":
                body = await asyncio.wait_for(conn.read(), 2)
            else:
                pieces: list[bytes] = []
                conn.stream(pieces.append)
                await asyncio.wait_for(conn.finished(), 2)
                body = b"".join(pieces)
            assert body == b"".join(parts)
            assert not conn.reusable
            pool.release(conn)


# -- 5./6. broken and malformed answers ------------------------------------------------------


@pytest.mark.parametrize("consume", ["read", "stream"])
@pytest.mark.parametrize(
    ("cut", "partial"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", b"only this"),
        (CHUNKED_CUT, EVENTS[0] + b"data: half"),
    ],
    ids=["content-length", "chunked"],
)
async def test_server_closing_mid_body_is_an_upstream_error(
    consume: str, cut: bytes, partial: bytes
) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(cut)
        # A graceful close (FIN), the harder case: EOF must not pass for the body's end.
        peer.writer.close()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            pieces: list[bytes] = []
            with pytest.raises(UpstreamError, match="closed"):
                if consume == "read":
                    await asyncio.wait_for(conn.read(), 2)
                else:
                    conn.stream(pieces.append)
                    await asyncio.wait_for(conn.finished(), 2)
            if consume == "stream":
                assert b"".join(pieces) == partial  # what did arrive was passed on
            assert not conn.reusable
            pool.release(conn)
            again = await pool.acquire(backend.origin, 1.0)
            assert again is not conn
            again.abort()
    assert backend.accepted == 2


@pytest.mark.parametrize(
    "coding", [b"Chunked", b"gzip\r\nTransfer-Encoding: chunked"], ids=["capitalised", "two-lines"]
)
async def test_cut_chunked_body_is_an_error_however_chunked_is_spelled(coding: bytes) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_CUT.replace(b"chunked", coding))
        peer.writer.close()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            with pytest.raises(UpstreamError, match="closed"):
                await asyncio.wait_for(conn.read(), 2)


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"\x00\x01\x02\x03",
    ],
    ids=["not-http", "bad-status", "bad-length", "bad-header", "binary"],
)
async def test_malformed_head_is_an_upstream_error(garbage: bytes) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(garbage)
        await peer.client_gone()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            with pytest.raises(UpstreamError, match="malformed"):
                await asyncio.wait_for(conn.head(), 2)
            assert not conn.reusable


async def test_an_oversized_response_head_is_refused() -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\n")
        for _ in range(8):  # 72 KB of headers, a line at a time
            await peer.send(b"X-Pad: %s\r\n" % (b"a" * 9000))
        await peer.client_gone()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            with pytest.raises(UpstreamError, match=f"head exceeds {MAX_HEAD_BYTES} bytes"):
                await asyncio.wait_for(conn.head(), 2)
            assert not conn.reusable


async def test_malformed_chunk_size_is_an_upstream_error() -> None:
    async with Backend(answer_each(CHUNKED + b"zz\r\nnot a chunk\r\n")) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            assert (await conn.head()).status == 200
            with pytest.raises(UpstreamError, match="malformed"):
                await asyncio.wait_for(conn.read(), 2)
            assert not conn.reusable


# -- 7. deadlines ----------------------------------------------------------------------------


@pytest.mark.parametrize("stall", ["before-head", "mid-body"])
async def test_deadline_ends_a_silent_exchange(stall: str) -> None:
    gone = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        if stall == "mid-body":
            await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")
        await peer.client_gone()
        gone.set()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin, deadline=0.2)
            # The outer bound only turns a missed deadline into a failure instead of a hang.
            with pytest.raises(UpstreamTimeout) as caught:
                async with asyncio.timeout(3):
                    await conn.head()
                    await conn.read()
            assert isinstance(caught.value, TimeoutError)
            await asyncio.wait_for(gone.wait(), 2)  # the backend saw the disconnect
            assert not conn.reusable


# -- 8./9. idle connections -------------------------------------------------------------------


@pytest.mark.parametrize(
    "after", [b"", b"HTTP/1.1 200 OK\r\n"], ids=["server-closes", "unsolicited-response"]
)
async def test_spoiled_idle_connection_is_not_handed_out(after: bytes) -> None:
    released = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(OK)
        if peer.n == 1:
            await released.wait()  # the connection sits idle in the pool now
            if after:
                await peer.send(after)
                await peer.client_gone()
            return  # Backend closes the connection
        await answer_each(OK)(peer)

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            first = await start(pool, backend.origin)
            assert await first.read() == b"ok"
            pool.release(first)
            assert first.reusable  # pooled, until the backend spoils it
            released.set()
            await until(lambda: not first.reusable)
            second = await start(pool, backend.origin)
            assert second is not first
            assert (await second.head()).status == 200
            assert await second.read() == b"ok"
            pool.release(second)
    assert backend.accepted == 2


async def _one_exchange(answer: bytes) -> tuple[ResponseHead, bytes, bool]:
    """Head, whole body and reusability of one request answered with ``answer``."""
    async with Backend(answer_each(answer)) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            try:
                return await conn.head(), await conn.read(), conn.reusable
            finally:
                conn.abort()


async def test_trailing_garbage_in_the_same_segment_spoils_the_connection() -> None:
    _, body, reusable = await _one_exchange(OK + b"garbage\r\n")
    assert (body, reusable) == (b"ok", False)


async def test_second_response_in_the_same_segment_is_not_taken_as_body() -> None:
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"
    _, body, reusable = await _one_exchange(OK + stray)
    assert (body, reusable) == (b"ok", False)


async def test_interim_response_is_skipped() -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    head, body, _ = await _one_exchange(early + OK)
    assert (head.status, head.headers.get("Content-Type"), body) == (
        200,
        "application/json",
        b"ok",
    )


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n" * 3,  # several, one after another
        b"HTTP/1.1 150 X\r\nX-Note: 1\r\n\r\n",  # unknown, without content: skipped too
    ],
)
async def test_every_interim_response_without_content_is_skipped(interim: bytes) -> None:
    head, body, _ = await _one_exchange(interim + OK)
    assert (head.status, "X-Note" in head.headers, body) == (200, False, b"ok")


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        # llhttp reads the body a length or chunking gives a 1xx from 104 up: it used to
        # reach the client as the first bytes of the answer after it.
        (b"HTTP/1.1 150 X\r\nContent-Length: 5\r\n\r\nEVIL!" + OK, "bad_interim"),
        (
            b"HTTP/1.1 199 X\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nEVIL!\r\n0\r\n\r\n" + OK,
            "bad_interim",
        ),
        (b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\nEVIL!" + OK, "bad_interim"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nEVIL!",
            "bad_interim",
        ),
        (b"HTTP/1.1 999 X\r\nContent-Length: 2\r\n\r\nok", "bad_status"),
        (b"HTTP/1.1 600 X\r\nContent-Length: 2\r\n\r\nok", "bad_status"),
        (b"HTTP/1.1 099 X\r\nContent-Length: 2\r\n\r\nok", "bad_status"),  # was waited on
    ],
)
async def test_a_head_outside_http_is_a_protocol_error(answer: bytes, kind: str) -> None:
    async with Backend(answer_each(answer)) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            with pytest.raises(ProtocolError) as caught:
                await asyncio.wait_for(conn.head(), 2)
            assert caught.value.kind == kind
            assert not conn.reusable


# -- 10. request heads and URLs ----------------------------------------------------------------


def test_request_head_bytes() -> None:
    origin, path = split_url("http://engine:8000/v1/completions")
    head = request_head(origin, path, {"Content-Type": "application/json"}, 12)
    assert head == (
        b"POST /v1/completions HTTP/1.1\r\nHost: engine:8000\r\n"
        b"Content-Type: application/json\r\nContent-Length: 12\r\n\r\n"
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Request-Id": "abc\r\nX-Injected: 1"},
        {"X-Request-Id": "abc\nX-Injected: 1"},
        {"X-Request-Id": "abc\rdef"},
        {"X-Injected: 1\r\nX-Request-Id": "abc"},
        {"X-Ok": "fine", "X-Request-Id": "\r\n\r\nGET / HTTP/1.1"},
    ],
)
def test_request_head_refuses_cr_and_lf(headers: dict[str, str]) -> None:
    origin = Origin("http", "127.0.0.1", 8000)
    with pytest.raises(ValueError, match="CR or LF"):
        request_head(origin, "/v1/completions", headers, 0)


def test_split_url_ipv6_with_prefix_and_query() -> None:
    origin, path = split_url("http://[::1]:8000/prefix/v1/x?q=1")
    assert origin == Origin("http", "::1", 8000)
    assert path == "/prefix/v1/x?q=1"
    assert origin.host_header == "[::1]:8000"


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://engine/v1", "engine"),
        ("http://engine:80/v1", "engine"),
        ("https://engine:443/v1", "engine"),
        ("https://engine/v1", "engine"),
        ("http://[::1]/v1", "[::1]"),
        ("https://engine:80/v1", "engine:80"),
        ("http://engine:443/v1", "engine:443"),
    ],
)
def test_host_header_omits_only_the_default_port(url: str, host: str) -> None:
    origin, path = split_url(url)
    assert origin.host_header == host
    assert f"\r\nHost: {host}\r\n".encode() in request_head(origin, path, {}, 0)


@pytest.mark.parametrize("url", ["ftp://engine/x", "/v1/completions", "http:///v1"])
def test_split_url_refuses_non_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        split_url(url)


# -- 11. connecting ----------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [None, 1.0])
async def test_refused_connect_is_an_upstream_error(timeout: float | None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with closing(ConnectionPool(IDLE)) as pool:
        with pytest.raises(UpstreamError, match="connect failed") as caught:
            await pool.acquire(Origin("http", "127.0.0.1", port), timeout)
        assert not isinstance(caught.value, TimeoutError)


async def test_connect_timeout_is_honoured() -> None:
    # A listener whose accept queue is full drops new SYNs, so a connect to it hangs.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(16):
                filler = socket.socket()
                fillers.append(filler)
                filler.setblocking(False)
                if filler.connect_ex(("127.0.0.1", port)) == errno.EINPROGRESS:
                    break  # this SYN was dropped: the queue is full
            else:
                pytest.fail("could not fill the listener's accept queue")
            with (
                closing(ConnectionPool(IDLE)) as pool,
                pytest.raises(UpstreamTimeout, match="connect timed out"),
            ):
                async with asyncio.timeout(3):
                    await pool.acquire(Origin("http", "127.0.0.1", port), 0.2)
        finally:
            for filler in fillers:
                filler.close()


# -- 12. back-pressure -------------------------------------------------------------------------


async def test_pause_stops_deliveries_until_resume() -> None:
    orders: asyncio.Queue[bytes | None] = asyncio.Queue()
    written: list[bytes] = []

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED)
        while (event := await orders.get()) is not None:
            await peer.send(chunk(event))
            written.append(event)
        await peer.send(b"0\r\n\r\n")
        await peer.client_gone()

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            pieces: list[bytes] = []
            conn.stream(pieces.append)
            orders.put_nowait(EVENTS[0])
            await until(lambda: b"".join(pieces) == EVENTS[0])
            conn.pause()
            for event in EVENTS[1:]:
                orders.put_nowait(event)
            await until(lambda: len(written) == len(EVENTS))  # the backend keeps writing
            for _ in range(20):  # and the client, paused, takes none of it
                await asyncio.sleep(0.002)
                assert b"".join(pieces) == EVENTS[0]
            conn.resume()
            await until(lambda: b"".join(pieces) == b"".join(EVENTS))
            orders.put_nowait(None)
            await asyncio.wait_for(conn.finished(), 2)
            assert conn.reusable
            pool.release(conn)


# -- the same under uvloop ---------------------------------------------------------------------

UVLOOP_CASES = [
    pytest.param(functools.partial(test_keep_alive_reuse_follows_the_response, OK, 1), id="reuse"),
    pytest.param(test_chunked_body_split_byte_by_byte_reaches_the_sink_whole, id="chunked"),
    pytest.param(
        functools.partial(test_read_limit_ends_an_endless_body_and_frees_the_backend, 100),
        id="limit",
    ),
    pytest.param(
        functools.partial(test_body_without_length_or_chunking_ends_at_eof, "stream"), id="eof"
    ),
    pytest.param(
        functools.partial(
            test_server_closing_mid_body_is_an_upstream_error,
            "stream",
            CHUNKED_CUT,
            EVENTS[0] + b"data: half",
        ),
        id="cut",
    ),
    pytest.param(
        functools.partial(test_malformed_head_is_an_upstream_error, b"x\r\n\r\n"), id="bad"
    ),
    pytest.param(
        functools.partial(test_deadline_ends_a_silent_exchange, "mid-body"), id="deadline"
    ),
    pytest.param(
        functools.partial(test_spoiled_idle_connection_is_not_handed_out, b""), id="idle-closed"
    ),
    pytest.param(
        functools.partial(test_spoiled_idle_connection_is_not_handed_out, b"HTTP/1.1 200 OK\r\n"),
        id="idle-data",
    ),
    pytest.param(functools.partial(test_refused_connect_is_an_upstream_error, 1.0), id="refused"),
    pytest.param(test_pause_stops_deliveries_until_resume, id="pause"),
]


@pytest.mark.parametrize("case", UVLOOP_CASES)
def test_under_uvloop(case: Callable[[], Coroutine[object, object, None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(case())

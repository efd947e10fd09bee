"""The lean HTTP/1.1 server (router/server/wire.py) over raw loopback sockets: which
requests it keeps and which it hands to aiohttp on the same connection, pipelining, answers
sent before the request was read whole, and the drain's stop. Its limits and refusals are
checked end to end by tests/integration/test_hardening_*.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.router.fake_upstream import MODEL, InProcess, in_process_router
from tests.router.harness import base_config

Head = tuple[int, dict[str, str]]


def config(**overrides: Any) -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")], **overrides)
    doc["health"]["scrape_metrics"] = False
    return doc


def chat(stream: bool = False, extra: bytes = b"", body: bytes | None = None) -> bytes:
    doc = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    data = orjson.dumps(doc) if body is None else body
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"%bContent-Length: %d\r\n\r\n%b" % (extra, len(data), data)
    )


async def connect(ip: InProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = ip.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def answer(reader: asyncio.StreamReader) -> tuple[Head, bytes]:
    """One HTTP/1.1 answer: (status, headers) and its body (de-chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:] if line)}
    if "content-length" in headers:
        return (status, headers), await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readline()).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readline()
    await reader.readline()
    return (status, headers), body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5) == b""


async def test_a_connection_goes_to_aiohttp_for_another_route_and_stays_there(
    tmp_path: Path,
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        connections = ip.served.connections
        reader, writer = await connect(ip)
        writer.write(chat())
        (status, headers), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert headers["server"] == "turnout" and "x-request-id" in headers
        assert connections.lean == 1
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, _), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["data"][0]["id"] == MODEL
        assert connections.lean == 0 and connections.count == 1  # aiohttp's now
        writer.write(chat())
        (status, _), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        writer.close()


async def test_unusual_shapes_are_served_by_aiohttp_from_their_first_byte(
    tmp_path: Path,
) -> None:
    chunked = b'{"model":"%b","messages":[{"role":"user","content":"hi"}]}' % MODEL.encode()
    async with in_process_router(tmp_path, config()) as ip:
        reader, writer = await connect(ip)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%b\r\n0\r\n\r\n" % (len(chunked), chunked)
        )
        (status, _), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert ip.served.connections.lean == 0
        writer.close()


async def test_both_servers_frame_a_stream_alike_and_keep_the_connection(
    tmp_path: Path,
) -> None:
    """A stream is framed by the answer object of whichever server took its request
    (router.server.answer.Chunks): the lean server's, or aiohttp's for a chunked request
    body. Both send the same events in valid chunks, end them, and serve the next request on
    the same connection."""
    doc = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    data = orjson.dumps(doc)
    by_aiohttp = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)
    )
    events: list[list[bytes]] = []
    async with in_process_router(tmp_path, config()) as ip:
        for request, lean in ((chat(body=data), 1), (by_aiohttp, 0)):
            reader, writer = await connect(ip)
            writer.write(request)
            (status, headers), body = await answer(reader)
            assert status == 200 and headers["content-type"] == "text/event-stream"
            assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
            assert body.endswith(b"data: [DONE]\n\n")
            events.append(body.split(b"\n\n"))
            assert ip.served.connections.lean == lean  # which server has the connection
            writer.write(chat())
            (status, _), body = await answer(reader)
            assert status == 200 and orjson.loads(body)["choices"]
            writer.close()
            await writer.wait_closed()
    assert events[0] == events[1] and len(events[0]) > 3  # two deltas, [DONE], ''


async def test_a_request_sent_during_a_stream_is_answered_after_it(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        ip.engine.release.clear()
        reader, writer = await connect(ip)
        writer.write(chat(stream=True))
        await asyncio.wait_for(ip.engine.streaming.wait(), 5)
        writer.write(chat())  # pipelined: waits, unparsed, until the stream has ended
        await asyncio.sleep(0.05)
        assert len(ip.engine.bodies) == 1
        ip.engine.release.set()
        (status, headers), body = await answer(reader)
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert body.endswith(b"data: [DONE]\n\n")
        (status, headers), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert "connection" not in headers  # still keep-alive
        writer.close()


async def test_two_requests_in_one_segment_get_one_answer_and_a_close(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        reader, writer = await connect(ip)
        writer.write(chat() + chat())
        (status, headers), _ = await answer(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(reader)
        assert len(ip.engine.bodies) == 1  # the second was never served: the client resends
        writer.close()


async def test_an_answer_before_the_whole_body_closes_once_the_body_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SY_TEST_WIRE_KEY", "sk-right")
    doc = config(api_keys=[{"name": "team", "env": "SY_TEST_WIRE_KEY"}], require_api_key=True)
    async with in_process_router(tmp_path, doc) as ip:
        reader, writer = await connect(ip)
        request = chat(extra=b"Authorization: Bearer sk-wrong\r\n")
        writer.write(request[:-10])
        (status, headers), body = await answer(reader)
        assert status == 401 and orjson.loads(body)["error"]["code"] == "invalid_api_key"
        assert headers["connection"] == "close"
        await asyncio.sleep(0.05)
        assert not reader.at_eof()  # the rest of the request is read before closing
        writer.write(request[-10:])
        assert await closed(reader)
        writer.close()


async def test_stop_closes_idle_connections_and_lets_a_stream_finish(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        idle_reader, idle_writer = await connect(ip)
        idle_writer.write(chat())
        await answer(idle_reader)
        ip.engine.release.clear()
        reader, writer = await connect(ip)
        writer.write(chat(stream=True))
        await asyncio.wait_for(ip.engine.streaming.wait(), 5)
        for site in ip.served.runner.sites:
            await site.stop()
        assert await closed(idle_reader)
        ip.engine.release.set()
        (status, _), body = await answer(reader)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        assert await closed(reader)  # once its answer is out
        idle_writer.close()
        writer.close()


async def test_a_half_closed_client_gets_its_answer_then_the_close(tmp_path: Path) -> None:
    """A client that sends its request and shuts its sending side (HTTP/1.1 lets it read
    on) gets the answer, marked Connection: close; then the connection closes."""
    async with in_process_router(tmp_path, config()) as ip:
        reader, writer = await connect(ip)
        writer.write(chat())
        writer.write_eof()
        (status, headers), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert headers["connection"] == "close"
        assert await closed(reader)
        writer.close()


async def test_a_half_close_once_the_answer_has_begun_is_the_client_leaving(
    tmp_path: Path,
) -> None:
    """A close looks the same as a half-close; once the answer is under way, it is taken for
    the client leaving, as it mostly is: the stream is cut at once, not at its next write."""
    async with in_process_router(tmp_path, config()) as ip:
        ip.engine.release.clear()
        reader, writer = await connect(ip)
        writer.write(chat(stream=True))
        await asyncio.wait_for(ip.engine.streaming.wait(), 5)
        writer.write_eof()
        received = await asyncio.wait_for(reader.read(), 5)  # until the router closes
        assert received.startswith(b"HTTP/1.1 200 ") and b"[DONE]" not in received
        writer.close()


@pytest.mark.parametrize(
    "sent",
    [b"", chat()[:20], chat()[:-5]],  # idle; a head cut short; a body cut short
    ids=["idle", "part-head", "part-body"],
)
async def test_a_half_close_without_a_whole_request_closes_at_once(
    tmp_path: Path, sent: bytes
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        reader, writer = await connect(ip)
        writer.write(sent)
        await asyncio.sleep(0.05)
        writer.write_eof()
        assert await closed(reader)
        assert ip.engine.bodies == []
        writer.close()


async def test_aiohttps_connections_answer_a_half_closed_client_too(tmp_path: Path) -> None:
    chunked = b'{"model":"%b","messages":[{"role":"user","content":"hi"}]}' % MODEL.encode()
    async with in_process_router(tmp_path, config()) as ip:
        reader, writer = await connect(ip)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%b\r\n0\r\n\r\n" % (len(chunked), chunked)
        )
        writer.write_eof()
        (status, _), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert await closed(reader)
        writer.close()
        reader, writer = await connect(ip)  # idle on aiohttp's side: closed at once
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, _), _ = await answer(reader)
        assert status == 200 and ip.served.connections.lean == 0
        writer.write_eof()
        assert await closed(reader)
        writer.close()


_CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
SPLIT_CASES = {
    "lean": (chat(), 200),
    "chunked: aiohttp's": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%b\r\n0\r\n\r\n" % (len(_CHAT), _CHAT),
        200,
    ),
    "another route: aiohttp's": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    "malformed: aiohttp's 400": (chat().replace(b"POST", b"P@ST", 1), 400),
    "repeated header: aiohttp's 400": (chat(extra=b"X-Request-Class: batch\r\n" * 2), 400),
    "head too long: aiohttp's 400": (chat(extra=b"X-Long: %b\r\n" % (b"a" * 9000)), 400),
}


class _Client(asyncio.Protocol):
    """A client that keeps what it received even if the connection is reset after."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.lost = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()

    def answer(self) -> tuple[int, dict[str, str], bytes] | None:
        """The first whole answer (with a Content-Length) received, if it has arrived."""
        head, sep, rest = bytes(self.data).partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
        length = int(headers["content-length"])
        return (int(lines[0].split()[1]), headers, rest[:length]) if len(rest) >= length else None


@pytest.mark.parametrize("name", list(SPLIT_CASES))
async def test_a_request_split_anywhere_gets_the_same_answer(tmp_path: Path, name: str) -> None:
    """The lean server decides what is aiohttp's from bytes that may arrive one at a time:
    the answer must not depend on where the segments break. (The client stops sending once
    an answer arrives: a refusal closes the connection, and writing on would reset it.)"""
    data, expected = SPLIT_CASES[name]
    loop = asyncio.get_running_loop()
    async with in_process_router(tmp_path, config()) as ip:
        host, port = ip.url.removeprefix("http://").split(":")
        for size in (len(data), 100, 7, 1):
            transport, client = await loop.create_connection(_Client, host, int(port))
            for i in range(0, len(data), size):
                if client.data or transport.is_closing():
                    break
                transport.write(data[i : i + size])
                await asyncio.sleep(0)
            async with asyncio.timeout(5):
                while (got := client.answer()) is None:
                    assert not client.lost.is_set(), (size, bytes(client.data[:300]))
                    await asyncio.sleep(0.005)
            status, headers, body = got
            assert status == expected, (size, status, body[:200])
            assert headers["content-type"].startswith("application/json"), (size, headers)
            if status >= 400:
                assert orjson.loads(body)["error"]["message"], size
            transport.close()


async def test_a_body_over_the_limit_gets_413_and_a_lean_one_within_it_is_served(
    tmp_path: Path,
) -> None:
    doc = config()
    doc.setdefault("listen", {})["max_body_bytes"] = 2048
    async with in_process_router(tmp_path, doc) as ip:
        reader, writer = await connect(ip)
        writer.write(chat(body=b'{"model":"%b","messages":[]}' % MODEL.encode() + b" " * 2048))
        (status, _), body = await answer(reader)  # declared too long: aiohttp refuses it
        assert status == 413 and orjson.loads(body)["error"]["code"] == "request_too_large"
        writer.close()
        reader, writer = await connect(ip)
        writer.write(chat(body=_CHAT + b" " * 1500))
        (status, _), body = await answer(reader)
        assert status == 200 and orjson.loads(body)["choices"]
        assert ip.served.connections.lean == 1
        writer.close()

"""A deliberately misbehaving OpenAI-style backend, for attack tests and benchmarks.

``python -m tests.misbehaving [--port 0] [--flood-bytes N] [--max-model-len N]`` prints
``misbehaving listening on http://127.0.0.1:PORT`` once it serves. The probes a router sends
(``/health``, ``/v1/models``, ``/metrics``) are answered properly and list every mode as a
model (with ``--max-model-len`` as its context length, 32768 by default); a completion
request misbehaves as its ``model`` names (:data:`MODES`), streamed or not as it asks.
``GET /stats`` tells how many bytes the flooding modes got out before their client left.
HTTP is written by hand on raw sockets, so framing and headers are exactly as scripted.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import re
from collections import Counter
from collections.abc import Mapping

import orjson

PAUSE = 1.0
"""Seconds ``mixed-endings`` waits after its first event (a client sees that event first)."""
SECRET = "hunter2-5f3a"
"""Written into the HTML error pages and leaky headers; must never reach a client."""
INTERNAL_HOST = "db-7.corp.internal"
MODES = {
    "ok": "a proper answer with usage",
    "no-usage": "a proper answer without usage",
    "string-usage": 'usage token counts as strings ("2")',
    "negative-usage": "negative usage token counts",
    "bad-finish": "a finish_reason that is not UTF-8",
    "endless-line": "a stream whose second event never ends (flood bytes without a separator)",
    "mixed-endings": "events ended by CRLF, LF, CR and a mix, with a pause after the first",
    "cut-mid-event": "a stream whose connection drops in the middle of its second event",
    "huge-body": "a non-streamed body of flood bytes",
    "html-502": "a 502 HTML page naming an internal host and a password",
    "html-404": "a 404 HTML page naming an internal host and a password",
    "leaky-headers": "a proper answer with Set-Cookie, Server, Via, X-Upstream-* ... headers",
    "endless-trailers": "a whole chunked answer, then trailer fields of flood bytes in all",
    "huge-trailer": "a whole chunked answer, then one trailer field of flood bytes",
    "hang": "reads the request, never answers",
    "hang-after-head": "sends a response head, never the body",
    "gzip-answer": "the answer gzip-compressed under Content-Encoding: gzip (streamed or not)",
    "gzip-label": "a plain answer labelled Content-Encoding: gzip (streamed or not)",
    "redirect": "a 307 with OpenAI error JSON whose Location names an internal host",
    "early-hints": "a 103 Early Hints, then a proper answer",
    "interim-body": "a 1xx with a Content-Length body, then a proper answer",
    "switching-protocols": "a 101 Switching Protocols nobody asked for",
    "status-999": "an answer with status 999",
    "full-budget": "a proper answer whose usage says each of its n choices took all its "
    "max_tokens, as from an engine that generated the whole budget",
}
INTERIM_BODY = b"EARLY-BYTES"
"""The body ``interim-body`` sends after its 1xx head; must never reach a client."""
_USAGE: Mapping[str, object] = {
    "ok": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    "leaky-headers": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    "mixed-endings": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    "bad-finish": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    "string-usage": {"prompt_tokens": "5", "completion_tokens": "2", "total_tokens": "7"},
    "negative-usage": {"prompt_tokens": -5, "completion_tokens": -2, "total_tokens": -7},
}
LEAKY_HEADERS = (
    ("Set-Cookie", f"session={SECRET}; Path=/; HttpOnly"),
    ("Server", "nginx/1.25.3 (Ubuntu)"),
    ("Via", f"1.1 {INTERNAL_HOST}"),
    ("X-Upstream-Addr", "10.0.7.12:8000"),
    ("X-Powered-By", "Express"),
    ("Alt-Svc", 'h3=":443"'),
    ("X-Engine-Note", "kept"),  # an ordinary end-to-end header: passed on
)
_HTML = (
    "<html><head><title>{status}</title></head><body><h1>{status}</h1>"
    f"<p>upstream {INTERNAL_HOST}:5432 refused: password={SECRET}</p>"
    "<hr><center>nginx/1.25.3</center></body></html>"
)
_PIECE = 64 * 1024
_HEAD = re.compile(rb"^(\S+) (\S+) HTTP/1\.[01]\r\n")


class Misbehaving:
    """The server; ``flood_bytes`` is how much ``endless-line`` and ``huge-body`` send."""

    def __init__(self, flood_bytes: int, max_model_len: int = 32768) -> None:
        self.flood_bytes = flood_bytes
        self.max_model_len = max_model_len
        """The context length its ``/v1/models`` reports for every model."""
        self.sent: Counter[str] = Counter()
        """Bytes of flood each mode got out (kernel buffers included)."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: requests one after another until a mode ends it or the peer goes."""
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away
        finally:
            writer.transport.abort()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        first = _HEAD.match(head)
        if first is None:
            return False
        length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
        body = await reader.readexactly(int(length[1])) if length else b""
        method, path = first[1], first[2].decode()
        if method == b"GET":
            return await self._get(path, writer)
        doc = orjson.loads(body) if body else {}
        mode, stream = str(doc.get("model", "ok")), bool(doc.get("stream"))
        chat = path.endswith("/chat/completions")
        usage = _full_budget(doc) if mode == "full-budget" else _USAGE.get(mode)
        wants_usage = bool((doc.get("stream_options") or {}).get("include_usage"))
        if mode in ("hang", "hang-after-head"):
            if mode == "hang-after-head":
                await _send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n")  # fmt: skip
            while await reader.read(_PIECE):  # until the client leaves
                pass
            return False
        if mode in ("html-502", "html-404"):
            status = 502 if mode == "html-502" else 404
            page = _HTML.format(status=status).encode()
            await _whole(writer, status, page, "text/html", (("Server", "nginx/1.25.3"),))
            return True
        if mode == "huge-body":
            return await self._huge_body(writer)
        if mode in _HEAD_MODES:
            return await _odd_head(writer, mode, chat, stream)
        if mode in ("endless-trailers", "huge-trailer"):
            return await self._trailers(writer, mode, chat, stream)
        extra = LEAKY_HEADERS if mode == "leaky-headers" else ()
        if not stream:
            answer = _completion(chat, "hi there", usage)
            await _whole(writer, 200, answer, "application/json", extra)
            return True
        await _send(writer, _stream_head(extra))
        if mode == "endless-line":
            return await self._endless_line(writer, chat)
        if mode == "cut-mid-event":
            partial = b'data: {"choices":[{"index":0,"delta":{"content":"partial'
            await _chunk(writer, _event(chat, "hi") + b"\n\n" + partial)
            return False
        if mode == "mixed-endings":
            await _chunk(writer, _event(chat, "Hel") + b"\r\n\r\n")
            await asyncio.sleep(PAUSE)
            events = [
                _event(chat, "lo") + b"\n\n",
                _event(chat, " wor") + b"\r\r",
                _event(chat, "ld") + b"\r\n\n",
                _event(chat, "", "stop") + b"\n\r\n",
            ]
        elif mode == "bad-finish":
            finish = _event(chat, "", "stop").replace(b'"stop"', b'"st\xff\xfeop"')
            events = [_event(chat, "hi") + b"\n\n", finish + b"\n\n"]
        else:
            events = [_event(chat, "hi") + b"\n\n", _event(chat, " there", "stop") + b"\n\n"]
        if usage is not None and wants_usage:
            events.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        await _chunk(writer, b"".join(events))
        await _send(writer, b"0\r\n\r\n")
        return True

    async def _get(self, path: str, writer: asyncio.StreamWriter) -> bool:
        if path == "/v1/models":
            length = self.max_model_len
            data = [{"id": m, "object": "model", "max_model_len": length} for m in MODES]
            doc: object = {"object": "list", "data": data}
        elif path == "/stats":
            doc = {"sent": dict(self.sent)}
        elif path == "/metrics":
            text = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            await _whole(writer, 200, text, "text/plain", ())
            return True
        else:
            doc = {"status": "ok"}
        await _whole(writer, 200, orjson.dumps(doc), "application/json", ())
        return True

    async def _endless_line(self, writer: asyncio.StreamWriter, chat: bool) -> bool:
        await _chunk(writer, _event(chat, "hi") + b"\n\n")  # one whole event reaches the client
        await _chunk(writer, b'data: {"choices":[{"index":0,"delta":{"content":"')
        piece = b"%x\r\n%s\r\n" % (_PIECE, b"x" * _PIECE)
        for _ in range(self.flood_bytes // _PIECE):
            await _send(writer, piece)
            self.sent["endless-line"] += _PIECE
        await _chunk(writer, b'"}}]}\n\ndata: [DONE]\n\n')
        await _send(writer, b"0\r\n\r\n")
        return True

    async def _huge_body(self, writer: asyncio.StreamWriter) -> bool:
        start, end = b'{"id":"c1","choices":[{"index":0,"message":{"content":"', b'"}}]}'
        count = self.flood_bytes // _PIECE
        length = len(start) + count * _PIECE + len(end)
        await _send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (length, start))  # fmt: skip
        piece = b"x" * _PIECE
        for _ in range(count):
            await _send(writer, piece)
            self.sent["huge-body"] += _PIECE
        await _send(writer, end)
        return True

    async def _trailers(
        self, writer: asyncio.StreamWriter, mode: str, chat: bool, stream: bool
    ) -> bool:
        """A whole answer (the stream to its ``[DONE]``), chunked; then trailers of flood
        bytes: field after field, or one field's value."""
        if stream:
            await _send(writer, _stream_head(()))
            ending = _event(chat, " there", "stop") + b"\n\ndata: [DONE]\n\n"
            await _chunk(writer, _event(chat, "hi") + b"\n\n" + ending)
        else:
            await _send(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\nTrailer: X-Flood\r\n\r\n")  # fmt: skip
            await _chunk(writer, _completion(chat, "hi there", _USAGE["ok"]))
        if mode == "huge-trailer":
            await _send(writer, b"0\r\nX-Flood: ")
            piece, end = b"x" * _PIECE, b"\r\n\r\n"
        else:
            await _send(writer, b"0\r\n")
            field = b"X-Flood: " + b"x" * 53 + b"\r\n"
            piece, end = field * (_PIECE // len(field)), b"\r\n"
        for _ in range(self.flood_bytes // len(piece)):
            await _send(writer, piece)
            self.sent[mode] += len(piece)
        await _send(writer, end)
        return True


_HEAD_MODES = frozenset(
    {"gzip-answer", "gzip-label", "redirect", "early-hints", "interim-body",
     "switching-protocols", "status-999"}
)  # fmt: skip


async def _odd_head(writer: asyncio.StreamWriter, mode: str, chat: bool, stream: bool) -> bool:
    """The modes whose status line or headers are what is wrong (or unusual)."""
    if stream:
        events = [_event(chat, "hi") + b"\n\n", _event(chat, " there", "stop") + b"\n\n"]
        body, kind = b"".join(events) + b"data: [DONE]\n\n", "text/event-stream"
    else:
        body, kind = _completion(chat, "hi there", _USAGE["ok"]), "application/json"
    if mode in ("gzip-answer", "gzip-label"):
        sent = gzip.compress(body) if mode == "gzip-answer" else body
        await _whole(writer, 200, sent, kind, (("Content-Encoding", "gzip"),))
    elif mode == "redirect":  # with an OpenAI error body, which alone would pass on as is
        location = f"http://{INTERNAL_HOST}:8000/v1/chat/completions?token={SECRET}"
        error = orjson.dumps({"error": {"message": "moved", "type": "redirect"}})
        await _whole(writer, 307, error, "application/json", (("Location", location),))
    elif mode == "status-999":
        await _whole(writer, 999, body, kind, ())
    elif mode == "switching-protocols":
        await _send(writer, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\n\r\n" + INTERIM_BODY)  # fmt: skip
        return False
    else:
        if mode == "early-hints":
            interim = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        else:
            interim = b"HTTP/1.1 150 X\r\nContent-Length: %d\r\n\r\n%s" % (
                len(INTERIM_BODY),
                INTERIM_BODY,
            )
        await _send(writer, interim)
        await _whole(writer, 200, body, kind, ())
    return True


def _full_budget(doc: Mapping[str, object]) -> dict[str, int]:
    """Usage as if each choice generated its whole ``max_tokens`` (16 when absent)."""
    budget = doc.get("max_completion_tokens") or doc.get("max_tokens") or 16
    n = doc.get("n") or 1
    assert isinstance(budget, int) and isinstance(n, int)
    return {"prompt_tokens": 5, "completion_tokens": n * budget, "total_tokens": 5 + n * budget}


def _event(chat: bool, text: str, finish: str | None = None) -> bytes:
    """One ``data:`` line (no line ending) of a chat or text completion stream."""
    choice: dict[str, object] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    kind = "chat.completion.chunk" if chat else "text_completion"
    return b"data: " + orjson.dumps({"id": "c1", "object": kind, "choices": [choice]})


def _completion(chat: bool, text: str, usage: object) -> bytes:
    choice: dict[str, object] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    kind = "chat.completion" if chat else "text_completion"
    doc = {"id": "c1", "object": kind, "choices": [choice], "usage": usage}
    return orjson.dumps(doc)


def _stream_head(extra: tuple[tuple[str, str], ...]) -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}".encode() for k, v in extra]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _whole(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    content_type: str,
    extra: tuple[tuple[str, str], ...],
) -> None:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}"]
    lines += [f"{k}: {v}" for k, v in extra]
    lines.append(f"Content-Length: {len(body)}")
    await _send(writer, ("\r\n".join(lines) + "\r\n\r\n").encode() + body)


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    await _send(writer, b"%x\r\n%s\r\n" % (len(data), data))


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _main(host: str, port: int, flood_bytes: int, max_model_len: int) -> None:
    server = await asyncio.start_server(Misbehaving(flood_bytes, max_model_len).serve, host, port)
    bound = server.sockets[0].getsockname()
    print(f"misbehaving listening on http://{bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.misbehaving", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--flood-bytes", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--max-model-len", type=int, default=32768)
    args = parser.parse_args()
    asyncio.run(_main(args.host, args.port, args.flood_bytes, args.max_model_len))


if __name__ == "__main__":
    main()

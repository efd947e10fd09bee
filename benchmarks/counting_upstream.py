"""An upstream that counts the requests it holds at once, to see a fleet's ``max_inflight``
from the backend's side.

    python -m benchmarks.counting_upstream [--hold 0.1]

Each chat completion is held ``--hold`` seconds, then answered with one small JSON body. A
request counts from its last byte read to its answer written, or until its connection
closes (a router that died). ``GET /peak`` answers ``{"now", "peak", "served"}``, ``POST
/peak`` the same and starts the peak again from the requests held now. Any other path (the
router's health probes) answers an empty model list at once. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from dataclasses import dataclass

import orjson
import uvloop

READY = "upstream listening on "
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)
_ANSWER = orjson.dumps({
    "id": "chatcmpl-count", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
})  # fmt: skip


@dataclass
class Count:
    now: int = 0
    peak: int = 0
    served: int = 0

    def figures(self) -> bytes:
        return orjson.dumps({"now": self.now, "peak": self.peak, "served": self.served})


class _Conn(asyncio.Protocol):
    def __init__(self, count: Count, hold: float) -> None:
        self._count = count
        self._hold = hold
        self._buf = b""
        self._held = 0  # this connection's requests being held (0 or 1: no pipelining)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport

    def connection_lost(self, exc: Exception | None) -> None:
        self._count.now -= self._held
        self._held = 0
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\r\n\r\n")) >= 0:
            head = self._buf[:end]
            m = _LENGTH.search(head)
            length = int(m[1]) if m else 0
            if len(self._buf) < end + 4 + length:
                return
            self._buf = self._buf[end + 4 + length :]
            method, path = head.split(b" ", 2)[:2]
            if path.startswith(b"/v1/chat"):
                self._held += 1
                self._count.now += 1
                self._count.peak = max(self._count.peak, self._count.now)
                asyncio.get_running_loop().call_later(self._hold, self._answer)
            elif path == b"/peak":
                doc = self._count.figures()
                if method == b"POST":
                    self._count.peak = self._count.now
                self._write(doc)
            else:
                self._write(b'{"object":"list","data":[]}')

    def _answer(self) -> None:
        if self._held and self._transport is not None:
            self._held -= 1
            self._count.now -= 1
            self._count.served += 1
            self._write(_ANSWER)

    def _write(self, doc: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc)
            )


async def _serve(hold: float) -> None:
    count = Count()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(count, hold), "127.0.0.1", 0, backlog=1024)
    print(f"{READY}http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=0.1, help="seconds a request is held")
    uvloop.run(_serve(parser.parse_args().hold))


if __name__ == "__main__":
    main()

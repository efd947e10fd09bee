"""Checking a batch's input file: OpenAI Batch lines, one JSON object a line.

A line is ``{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>, "body": {...}}``.
Any bad line fails the whole batch (as OpenAI's does) with every problem found, each naming
its line; the errors listed are capped so that a file of garbage cannot fill the database.

The file is read a chunk at a time (:func:`load`) and its lines are stored as they pass, in
groups, so memory holds one chunk, one group and the line being cut, which is bounded too:
a line longer than the router's body limit could never be sent, and is a problem of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

import orjson

from router.batch import content
from router.batch.db import CHUNK_BYTES
from router.batch.store import BatchStore, FileRow, NewLine

MAX_REPORTED = 100
"""Validation errors kept for one batch (the rest are counted in the last one's message)."""
GROUP_LINES = 1000
"""Lines stored in one transaction at most (also at most about a chunk of bodies)."""


@dataclass(frozen=True, slots=True)
class LineError:
    """One problem with the input file, in the shape of a Batch's ``errors.data`` entry."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


class Validator:
    """Cuts a file given piece by piece into lines and checks each (pure; no I/O)."""

    def __init__(self, endpoint: str, max_lines: int, max_line_bytes: int) -> None:
        self._endpoint = endpoint
        self._max_lines = max_lines
        self._max_line = max_line_bytes
        self._tail = bytearray()
        self._too_long = False
        """The line being cut is past the limit: its bytes are dropped until its end."""
        self._number = 0
        self._seen: set[bytes] = set()
        """Digests of the custom_ids so far: a fixed size each, however long the ids are."""
        self.count = 0
        """Good lines so far."""
        self.errors: list[LineError] = []
        self._more = 0
        """Errors found past :data:`MAX_REPORTED`."""
        self.full = False
        """More than ``max_lines``: the rest of the file needs no reading."""

    def feed(self, data: bytes) -> list[NewLine]:
        """The good lines completed by ``data``."""
        out: list[NewLine] = []
        start = 0
        while not self.full and (end := data.find(b"\n", start)) != -1:
            if self._too_long:
                self._too_long = False
            elif self._tail:
                self._tail += data[start:end]
                self._check(bytes(self._tail), out)
            else:
                self._check(data[start:end], out)
            self._tail.clear()
            start = end + 1
        if not self.full and not self._too_long and start < len(data):
            self._tail += data[start:]
            if len(self._tail) > self._max_line:
                self._number += 1  # the line is counted now, its end is dropped
                self._problem(("line_too_large", self._too_large, None), self._number)
                self._tail.clear()
                self._too_long = True
        return out

    def finish(self) -> list[NewLine]:
        """The last line (one without a newline); then :attr:`errors` are complete."""
        out: list[NewLine] = []
        if self._tail and not self._too_long and not self.full:
            self._check(bytes(self._tail), out)
        self._tail.clear()
        if not self.count and not self.errors and not self.full:
            self._problem(("empty_file", "the input file holds no request lines", None), None)
        if self._more:
            last = self.errors[-1]
            message = f"{last.message} (and {self._more} more errors)"
            self.errors[-1] = LineError(last.code, message, last.line, last.param)
        return out

    @property
    def _too_large(self) -> str:
        return f"a line is at most {self._max_line} bytes (the router's body limit)"

    def _check(self, raw: bytes, out: list[NewLine]) -> None:
        self._number += 1
        if not raw.strip():
            return
        if len(raw) > self._max_line:
            self._problem(("line_too_large", self._too_large, None), self._number)
            return
        if self.count >= self._max_lines:
            message = f"a batch holds at most {self._max_lines} lines"
            self._problem(("too_many_lines", message, None), None)
            self.full = True
            return
        line, problem = _line(raw, self._endpoint, self._seen)
        if problem is not None:
            self._problem(problem, self._number)
        elif line is not None:
            self.count += 1
            if not self.errors:  # a batch that fails stores no lines
                out.append(line)

    def _problem(self, problem: Problem, number: int | None) -> None:
        if len(self.errors) < MAX_REPORTED:
            self.errors.append(LineError(problem[0], problem[1], number, problem[2]))
        else:
            self._more += 1


async def load(store: BatchStore, source: FileRow, batch_id: str, validator: Validator) -> int:
    """Read ``source``, checking its lines and storing the good ones under ``batch_id`` while
    none is bad; the number of good lines (``validator.errors`` holds the problems)."""
    stored = 0
    group: list[NewLine] = []
    group_bytes = 0

    async def flush() -> None:
        nonlocal stored, group, group_bytes
        if group and not validator.errors:
            await store.add_lines(batch_id, stored, group)
            stored += len(group)
        group, group_bytes = [], 0

    async def keep(lines: list[NewLine]) -> None:
        nonlocal group_bytes
        for line in lines:
            group.append(line)
            group_bytes += len(line.body)
            if len(group) >= GROUP_LINES or group_bytes >= CHUNK_BYTES:
                await flush()

    async for piece in content.read(store, source.id, source.bytes):
        # Parsing a chunk takes milliseconds of CPU: in a thread, the loop keeps serving.
        await keep(await asyncio.to_thread(validator.feed, piece))
        if validator.full:
            break
    await keep(validator.finish())
    await flush()
    return validator.count


Problem = tuple[str, str, str | None]


def _line(raw: bytes, endpoint: str, seen: set[bytes]) -> tuple[NewLine | None, Problem | None]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, ("invalid_json_line", "the line is not valid JSON", None)
    if not isinstance(doc, dict):
        return None, ("invalid_json_line", "the line is not a JSON object", None)
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, ("missing_custom_id", "custom_id must be a non-empty string", "custom_id")
    digest = hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    if digest in seen:
        # The id itself is the client's data: not quoted back.
        return None, ("duplicate_custom_id", "custom_id is used by an earlier line", "custom_id")
    seen.add(digest)
    if doc.get("method") != "POST":
        return None, ("invalid_method", "method must be POST", "method")
    if doc.get("url") != endpoint:
        return None, ("invalid_url", f"url must be the batch's endpoint {endpoint}", "url")
    body = doc.get("body")
    if not isinstance(body, dict):
        return None, ("invalid_body", "body must be a JSON object", "body")
    if body.get("stream") is True:
        return None, ("invalid_body", "streaming is not supported in a batch", "body.stream")
    return NewLine(custom_id, endpoint, orjson.dumps(body)), None

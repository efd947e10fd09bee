"""The access log: one JSON line per finished request, on stdout.

Written once per request when its record is finished (router.proxy.exchange), never per
chunk: the line is serialised by orjson, and the lines of one turn of the event loop go out
together in one ``os.write`` at the end of that turn (a system call per line was the largest
single cost of a short request). A write holds whole lines and never more than ``PIPE_BUF``
bytes, so the lines of several workers sharing one stdout never interleave. What a line holds
is chosen by its writer and is never a prompt, an answer or a key: the tenant appears only as
the keyed hash the capture uses (router.control.auth.Tenant.capture_id).

``access_log.sample`` draws each request at random; ``access_log.enabled: false`` writes
nothing. Both are read per request from the live config, so a reload changes them at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import select
from collections.abc import Mapping

import orjson

from router.config.model import AccessLogSettings

log = logging.getLogger("router")
STDOUT = 1
# A datetime is written as RFC 3339 in UTC with a Z (orjson's own formatting: strftime would
# cost more than the rest of the line).
_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_UTC_Z


def _printable(value: object) -> object:
    """``value`` with text orjson refuses (lone surrogates, from a header that was not UTF-8)
    replaced."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


class AccessLog:
    """Writes access lines to a file descriptor (stdout unless a test says otherwise)."""

    def __init__(self, fd: int = STDOUT, rng: random.Random | None = None) -> None:
        self._fd = fd
        self._rng = rng if rng is not None else random.Random()
        self._failed = False
        self._pending = bytearray()
        """Lines of this turn of the event loop, written by :meth:`flush` at its end."""
        self._due = False
        """A :meth:`flush` is scheduled."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the last flush was scheduled on (asking for the running loop makes a
        system call, getpid, in Python 3.11)."""

    def wanted(self, settings: AccessLogSettings) -> bool:
        """Whether this request is to be logged (draws the sample); the caller then builds the
        line only when it is."""
        if not settings.enabled:
            return False
        return settings.sample >= 1.0 or self._rng.random() < settings.sample

    def write(self, line: Mapping[str, object]) -> None:
        """Write ``line`` as one JSON line, at the end of this turn of the running event loop
        (at once without one); a failed write is logged once, never raised (the request's
        other bookkeeping must go on)."""
        try:
            data = orjson.dumps(line, option=_OPTIONS)
        except TypeError:
            data = orjson.dumps({k: _printable(v) for k, v in line.items()}, option=_OPTIONS)
        if not self._due:
            loop = self._loop
            if loop is None or not loop.is_running():
                try:
                    loop = self._loop = asyncio.get_running_loop()
                except RuntimeError:  # no loop: nothing would flush later
                    self._write(data)
                    return
            loop.call_soon(self.flush)
            self._due = True
        elif len(self._pending) + len(data) > select.PIPE_BUF:
            self._write(bytes(self._pending))  # one write over PIPE_BUF could interleave
            self._pending.clear()
        self._pending += data

    def flush(self) -> None:
        """Write the lines held back so far (the app calls it once more as it stops)."""
        self._due = False
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._fd, data)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("access log: cannot write to fd %d (%s); lines are lost", self._fd, exc)

"""Request ids: unique across workers and restarts without a random draw per request.

Each process draws a 64-bit random prefix once (again in a forked child, which must not
share its parent's) and numbers its requests after it: ``req-<prefix>-<n>``. Two processes
share a prefix with a chance of about k²/2⁶⁵ for k processes ever started, the collision odds
of a random id of that size, while a request pays for one counter step and one format instead
of ``uuid4``'s 16 bytes from the OS.
"""

from __future__ import annotations

import itertools
import os


class _Ids:
    """The process's id source (a property of the process, like its pid, hence module-wide)."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"req-{self._prefix}-{next(self._counter):x}"


_IDS = _Ids()
os.register_at_fork(after_in_child=_IDS.reseed)


MAX_CLIENT_ID = 256
"""The longest ``X-Request-Id`` kept from a client: the id is echoed, logged and captured with
every request, so a client must not make each of those lines kilobytes longer."""


def usable_id(value: str) -> bool:
    """Whether ``value`` can stand as a request id: printable ASCII, at most
    :data:`MAX_CLIENT_ID` characters (anything else would be mangled or bloat every record)."""
    return len(value) <= MAX_CLIENT_ID and value.isascii() and value.isprintable()


def new_request_id() -> str:
    """A fresh id for a request that came without ``X-Request-Id``."""
    return _IDS.next()


def request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is :func:`usable_id`, else a fresh one."""
    return given if given and usable_id(given) else _IDS.next()

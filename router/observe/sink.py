"""The capture file's owner: a small process that copies whole lines from a pipe to the file.

Why a separate process: a ``kill -9`` can cut a large ``write(2)`` to a regular file short,
tearing a line. The sink copies only complete lines from the pipe to the file, so when the
router dies mid-write the sink sees EOF, drops the incomplete tail and exits: the file loses
at most the lines in flight and never holds half a line. A sink killed itself may leave a
line half written; the next sink to write to the file (or to start on it) cuts that
unterminated tail first, under the file's lock. Run as
``python -m router.observe.sink PATH ROTATE_BYTES`` by the capture writer.
"""

from __future__ import annotations

import fcntl
import os
import sys


class Sink:
    """The file side, in its own process: whole lines in, whole lines out, with rotation.

    Several sinks may share one file (``turnout serve --workers N`` runs one writer per
    worker): each write holds an exclusive ``flock`` on the current file, sizes come from the
    file itself, and a sink whose file was rotated away by a sibling follows the path to the
    new file before writing.
    """

    def __init__(self, path: str, rotate_bytes: int) -> None:
        self._path = path
        self._limit = rotate_bytes
        self._fd = open_append(path)
        self._lock_current()
        try:
            _cut_torn_tail(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def run(self, fd: int) -> None:
        """Copy complete lines from ``fd`` until EOF; an incomplete last line is discarded.

        The pieces of a line still arriving are kept apart and joined once it ends, and only
        each new piece is searched for its end: linear in the line's length (a pipe hands
        over at most 64 KiB a read, so an 8 MiB line comes in 128 pieces)."""
        held: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                held.append(chunk)
                continue
            if held:
                held.append(chunk[:cut])
                self._lines(b"".join(held))
                held.clear()
            else:
                self._lines(chunk if cut == len(chunk) else chunk[:cut])
            if cut < len(chunk):
                held.append(chunk[cut:])
        os.close(self._fd)

    def _lines(self, data: bytes) -> None:
        self._lock_current()
        try:
            _cut_torn_tail(self._fd)
            size = os.fstat(self._fd).st_size
            if not self._limit or size + len(data) <= self._limit:
                write_all(self._fd, data)
                return
            for line in data.splitlines(keepends=True):
                # A sibling may have written to the new file before we locked it: rotate
                # again if its lines left no room for this one.
                while size and size + len(line) > self._limit:
                    self._rotate()
                    size = os.fstat(self._fd).st_size
                write_all(self._fd, line)
                size += len(line)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _lock_current(self) -> None:
        """Lock our file; if ``path`` now names another file (rotated), follow it first."""
        while True:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            mine = os.fstat(self._fd)
            try:
                named = os.stat(self._path)
                if (named.st_ino, named.st_dev) == (mine.st_ino, mine.st_dev):
                    return
            except FileNotFoundError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = open_append(self._path)

    def _rotate(self) -> None:
        """``path`` becomes ``path.1``; older rotations move up one number. Called locked."""
        path = self._path
        n = 1
        while os.path.exists(f"{path}.{n}"):
            n += 1
        for k in range(n - 1, 0, -1):
            os.replace(f"{path}.{k}", f"{path}.{k + 1}")
        os.replace(path, f"{path}.1")
        old = self._fd
        self._fd = open_append(path)
        # Another sink may have created the new file between the rename and our open, locked
        # it, written and rotated it in turn: follow ``path`` as any lock does, or this sink
        # would write, and then rotate, beside the one that holds the current file.
        self._lock_current()
        fcntl.flock(old, fcntl.LOCK_UN)
        os.close(old)


def _cut_torn_tail(fd: int) -> None:
    """Truncate the file after its last newline if it does not end with one: what a writer
    killed mid-``write(2)`` left. Called with the file locked, so no sibling is writing."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return
    end = size - 1
    while end > 0:
        start = max(0, end - (1 << 16))
        block = os.pread(fd, end - start, start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            os.ftruncate(fd, start + newline + 1)
            return
        end = start
    os.ftruncate(fd, 0)


def open_append(path: str) -> int:
    """``path`` opened for appending (and reading: a torn tail is looked for), made 0600."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


if __name__ == "__main__":
    # Own session (see _spawn): a Ctrl-C or group kill reaches only the router, whose exit
    # closes the pipe; the sink then finishes the file on EOF.
    Sink(sys.argv[1], int(sys.argv[2])).run(0)

"""Where the lines and events of a server-sent event stream end, found as
:class:`turnout.common.sse.StreamMeter` needs: each byte scanned once, whatever the line
endings (CR, LF or CRLF, mixed freely)."""

from __future__ import annotations

import re

LF = 0x0A
CR = 0x0D
# A line ending followed by another: the second ends an empty line.
_BLANK = re.compile(rb"(?:\r\n|\r(?!\n)|\n)[\r\n]")


def blank_line(data: bytes, pos: int) -> int:
    """Where the first empty line after ``pos`` starts in ``data`` (CR, LF or CRLF endings).

    ``pos`` is not taken for a line start, and never falls between the CR and LF of a CRLF.
    Line endings are found with ``bytes.find`` (each byte scanned once), past a few lines with
    a regular expression (so that a stream of one-byte lines costs no Python step per line).
    """
    n = len(data)
    lf = data.find(b"\n", pos)
    cr = data.find(b"\r", pos)
    lines = 0
    while lf >= 0 or cr >= 0:
        if cr < 0 or 0 <= lf < cr:
            nxt = lf + 1
        elif cr + 1 < n and data[cr + 1] == LF:
            nxt = cr + 2
        else:
            nxt = cr + 1
        if nxt >= n:
            return -1
        c = data[nxt]
        if c in (LF, CR):
            return nxt
        lines += 1
        if lines == 8:  # many short lines: let the regex engine walk the rest
            m = _BLANK.search(data, nxt)
            return -1 if m is None else m.end() - 1
        if lf < nxt:
            lf = data.find(b"\n", nxt) if lf >= 0 else -1
        if cr < nxt:
            cr = data.find(b"\r", nxt) if cr >= 0 else -1
    return -1

"""Per-request figures of one run, kept for pairing the run with another by ``custom_id``.

A comparison (:mod:`replay.compare`) measures two runs' difference request by request, so the
report keeps each request's figures in ``runs[i].requests``: columns of equal length, one
entry per request. Memory and the report's size are bounded: past ``CAP`` requests a run
keeps those whose ``crc32(custom_id)`` is below a threshold, halved each time the table
fills again. The hash, not the order of arrival, decides, so every run of a trace keeps the
same requests (a run with a lower threshold keeps a subset of another's), and the kept
requests are a uniform sample of the trace: past ``CAP`` requests a comparison's intervals
are those of its sample, somewhat wider than the whole trace's would be.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from replay.bootstrap import Side
from replay.client import Result

CAP = 10_000
"""Requests a run keeps for pairing before it keeps a hashed sample."""
_FULL = 32  # crc32 has 32 bits: below 2**32, every request is kept
COLUMNS = ("class", "ok", "ttft_ms", "tpot_ms", "itl_sum_ms", "itl_n", "e2e_ms", "good")
"""The table's columns besides ``ids``; latencies are null where a request has none, and
``good`` (met its class's SLO) is null for a class without one."""

Row = tuple[str, int, float | None, float | None, float, int, float | None, int | None]


def _hash(custom_id: str) -> int:
    return zlib.crc32(custom_id.encode())


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class Requests:
    """One run's table (see the module doc); :meth:`to_dict` is its ``requests`` entry."""

    __slots__ = ("_cap", "_rows", "bits", "duplicates")

    def __init__(self, cap: int = CAP) -> None:
        self._cap = cap
        self._rows: dict[str, Row] = {}
        self.bits = _FULL
        """The kept requests' hashes are below ``2**bits``."""
        self.duplicates = 0
        """Requests whose ``custom_id`` came again in the run: only the first is kept."""

    def add(self, r: Result, good: bool | None) -> None:
        """Keep ``r``'s figures if its id is in the sample (``good``: met its SLO)."""
        cid = r.custom_id
        if _hash(cid) >> self.bits:
            return
        if cid in self._rows:
            self.duplicates += 1
            return
        ok = r.ok
        self._rows[cid] = (
            r.request_class,
            int(ok),
            _ms(r.ttft) if ok else None,
            _ms(r.tpot) if ok else None,
            round(sum(r.itls) * 1000.0, 3) if ok else 0.0,
            len(r.itls) if ok else 0,
            _ms(r.e2e) if ok else None,
            None if good is None else int(good),
        )
        while len(self._rows) > self._cap:
            self.bits -= 1
            self._rows = {k: v for k, v in self._rows.items() if not _hash(k) >> self.bits}

    def __len__(self) -> int:
        return len(self._rows)

    def to_dict(self) -> dict[str, Any]:
        """Columns of equal length, and the share of the trace's ids kept (``sampled``)."""
        rows = list(self._rows.values())
        out: dict[str, Any] = {
            "sampled": 2.0 ** (self.bits - _FULL),
            "duplicates": self.duplicates,
            "ids": list(self._rows),
        }
        for k, name in enumerate(COLUMNS):
            out[name] = [row[k] for row in rows]
        return out


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def strata(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any], *, cap: int | None = None
) -> tuple[dict[str, tuple[Side, Side]], int]:
    """Two runs' ``requests`` tables matched by id, per class (the baseline's class of each
    request), as :func:`replay.bootstrap.paired` takes them; and how many matched.

    Where the two sampled different shares of the trace, the smaller sample's ids are the
    ones both hold (see the module doc), so the match is a uniform sample as well; with
    ``cap``, at most that many of the matched ids are kept, those of the lowest hashes (a
    uniform sample again, the same for every comparison of the same runs).
    """
    where = {cid: i for i, cid in enumerate(candidate["ids"])}
    matched = [(i, j) for i, cid in enumerate(baseline["ids"]) if (j := where.get(cid)) is not None]
    if cap is not None and len(matched) > cap:
        ids = baseline["ids"]
        matched.sort(key=lambda ij: _hash(ids[ij[0]]))
        matched = sorted(matched[:cap])
    picks: dict[str, list[tuple[int, int]]] = {}
    for i, j in matched:
        picks.setdefault(baseline["class"][i], []).append((i, j))
    out = {}
    for cls, pairs in sorted(picks.items()):
        a = _side(baseline, [i for i, _ in pairs])
        b = _side(candidate, [j for _, j in pairs])
        if (a.good is None) != (b.good is None):  # one run judged the class, the other not
            a.good = b.good = None
        out[cls] = a, b
    return out, sum(len(p) for p in picks.values())


def _side(table: Mapping[str, Any], rows: Sequence[int]) -> Side:
    def col(name: str) -> list[Any]:
        values = table[name]
        return [values[i] for i in rows]

    good = col("good")
    return Side(
        ttft=_nan(col("ttft_ms")),
        tpot=_nan(col("tpot_ms")),
        itl_sum=[float(v) for v in col("itl_sum_ms")],
        itl_n=[int(v) for v in col("itl_n")],
        e2e=_nan(col("e2e_ms")),
        ok=[int(v) for v in col("ok")],
        good=None if any(v is None for v in good) else [int(v) for v in good],
    )

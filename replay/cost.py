"""What each backend did for a run, and what it cost: ``by_backend`` and ``cost``.

Per backend and class the run counts requests, prompt, cached and output tokens, and the
seconds its requests were in flight there (send to last byte, as the replayer saw them);
per backend its busy time: how long at least one of the run's requests was in flight there.

**Cost** (:func:`price`) turns busy time into money at the backend's ``usd_per_hour`` (the
router config's ``pricing``, or ``--price BACKEND=USD``): a backend costs its busy hours times
its price, and that cost is split among the classes in proportion to the seconds their
requests spent in flight on it. Per class (and over the run) the report gives dollars, and
dollars per million output tokens. A prefix-cache hit is priced as what it saved: each
cached prompt token at what a fresh prompt token cost on that backend, which is the share of
its cost spent before first tokens (streamed requests' TTFT against their time in flight)
divided by the fresh prompt tokens prefilled then. A class served by a backend without a
price has no cost: the report names the backends missing one.

The busy time is exact while a backend's busy stretches number at most ``MAX_STRETCHES``;
past that the shortest idle gaps are bridged, and ``bridged_s`` bounds the time so added.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping
from typing import Any

from replay.client import Result

MAX_STRETCHES = 20_000
MAX_BACKENDS = 32
"""Backends told apart; a target naming more has the rest counted as ``other``."""
NONE = "none"
"""The backend of a request the target answered without naming one (refused early)."""


def backend_key(r: Result, known: Collection[str]) -> str:
    """The name ``r``'s backend is counted under, given the names counted so far."""
    name = r.backend or NONE
    return name if name in known or len(known) < MAX_BACKENDS else "other"


class Busy:
    """A union of time intervals as sorted disjoint stretches, in bounded memory."""

    __slots__ = ("_gap", "bridged_s", "ends", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.bridged_s = 0.0
        """At most this much idle time is counted as busy: the gaps bridged when there were
        too many stretches to keep apart (a gap bridged may have filled in later)."""
        self._gap = 1e-3

    def add(self, lo: float, hi: float) -> None:
        """Count ``[lo, hi]`` as busy."""
        if hi <= lo:
            return
        i = bisect.bisect_left(self.ends, lo)  # the first stretch ending at or after lo
        j = bisect.bisect_right(self.starts, hi)  # past the last one starting by hi
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j] = [lo]
        self.ends[i:j] = [hi]
        if len(self.starts) > MAX_STRETCHES:
            self._bridge()

    def _bridge(self) -> None:
        """Join stretches across the shortest gaps until half the room is free."""
        while len(self.starts) > MAX_STRETCHES // 2:
            starts, ends = [self.starts[0]], [self.ends[0]]
            for s, e in zip(self.starts[1:], self.ends[1:], strict=True):
                if s - ends[-1] < self._gap:
                    self.bridged_s += s - ends[-1]
                    ends[-1] = e
                else:
                    starts.append(s)
                    ends.append(e)
            self.starts, self.ends = starts, ends
            self._gap *= 2

    @property
    def seconds(self) -> float:
        """The union's length."""
        return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))


_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "output_tokens", "inflight_s",
           "prefill_s", "prefill_tokens")  # fmt: skip


def _figures(c: list[float]) -> dict[str, float | int]:
    return {k: round(v, 6) if k.endswith("_s") else int(v) for k, v in zip(_FIELDS, c, strict=True)}


class Backends:
    """Accumulates a run's ``by_backend`` (see the module doc)."""

    def __init__(self) -> None:
        self._classes: dict[str, dict[str, list[float]]] = {}
        self._busy: dict[str, Busy] = {}

    def add(self, r: Result, sent: float) -> None:
        """Account for ``r``, sent ``sent`` seconds into the run."""
        name = backend_key(r, self._classes)
        c = self._classes.setdefault(name, {}).setdefault(r.request_class, [0.0] * 7)
        e2e = r.e2e or 0.0
        c[0] += 1
        c[4] += e2e
        if r.ok:
            cached = r.cached_tokens or 0
            prompt = r.prompt_tokens or 0
            c[1] += prompt
            c[2] += cached
            c[3] += r.output_tokens
            if r.stream and r.ttft is not None:
                c[5] += r.ttft
                c[6] += max(prompt - cached, 0)
        if name != NONE:
            self._busy.setdefault(name, Busy()).add(sent, sent + e2e)

    def to_dict(self) -> dict[str, Any]:
        """``{backend: {requests, busy_s, bridged_s, by_class: {class: figures}}}``."""
        out = {}
        for name, classes in sorted(self._classes.items()):
            busy = self._busy.get(name)
            by_class = {cls: _figures(c) for cls, c in sorted(classes.items())}
            out[name] = {
                "requests": sum(c["requests"] for c in by_class.values()),
                "busy_s": round(busy.seconds, 6) if busy else 0.0,
                "bridged_s": round(busy.bridged_s, 6) if busy else 0.0,
                "by_class": by_class,
            }
        return out


def _per_million(usd: float | None, tokens: float) -> float | None:
    return None if usd is None or not tokens else usd / tokens * 1e6


def price(by_backend: Mapping[str, Any], pricing: Mapping[str, float]) -> dict[str, Any]:
    """The run's ``cost`` from its ``by_backend`` at ``pricing`` (USD per hour a backend)."""
    classes: dict[str, dict[str, float]] = {}
    missing: dict[str, set[str]] = {}
    backends = {}
    for name, b in by_backend.items():
        rate = pricing.get(name)
        figures = b["by_class"]
        for cls, c in figures.items():
            got = classes.setdefault(cls, {"usd": 0.0, "saved_usd": 0.0, "output_tokens": 0})
            got["output_tokens"] += c["output_tokens"]
            if rate is None and name != NONE:
                missing.setdefault(cls, set()).add(name)
        if rate is None:
            continue
        usd = b["busy_s"] * rate / 3600.0
        backends[name] = {"usd_per_hour": rate, "busy_s": b["busy_s"], "usd": usd}
        inflight = sum(c["inflight_s"] for c in figures.values())
        prefill_s = sum(c["prefill_s"] for c in figures.values())
        prefill_tokens = sum(c["prefill_tokens"] for c in figures.values())
        per_prompt_token = (
            usd * prefill_s / inflight / prefill_tokens if inflight and prefill_tokens else 0.0
        )
        for cls, c in figures.items():
            share = c["inflight_s"] / inflight if inflight else 0.0
            classes[cls]["usd"] += usd * share
            classes[cls]["saved_usd"] += c["cached_tokens"] * per_prompt_token
    by_class = {}
    for cls, got in sorted(classes.items()):
        usd = None if cls in missing else got["usd"]
        by_class[cls] = {
            "usd": usd,
            "usd_per_1m_output": _per_million(usd, got["output_tokens"]),
            "saved_usd": None if cls in missing else got["saved_usd"],
            "unpriced": sorted(missing.get(cls, ())),
        }
    unpriced = sorted({n for names in missing.values() for n in names})
    total = None if unpriced else sum(c["usd"] for c in classes.values())
    out_tokens = sum(c["output_tokens"] for c in classes.values())
    return {
        "usd": total,
        "usd_per_1m_output": _per_million(total, out_tokens),
        "saved_usd": None if unpriced else sum(c["saved_usd"] for c in classes.values()),
        "unpriced": unpriced,
        "by_class": by_class,
        "by_backend": backends,
    }

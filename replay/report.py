"""Summaries with vLLM's benchmark metric names, and each run's entry in the report JSON.

Per-request figures go into :class:`~replay.stats.Column` objects (bounded memory, exact
percentiles up to 20,000 values a column) and a bounded pairing table
(:class:`~replay.pairs.Requests`), never into a list of result objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replay.client import Result
from replay.cost import Backends
from replay.pairs import Requests
from replay.stats import Column
from replay.timeline import Frame, Timeline

Metrics = dict[str, float | int | None]
REASONS = 16
"""Distinct failure reasons a run tells apart; later ones are counted as one (bounded)."""
_REASON_CHARS = 160


class Acc:
    """Accumulates one group's results (a run, a class, a shadow target)."""

    __slots__ = (
        "completed",
        "e2e",
        "failed",
        "in_tokens",
        "itl",
        "lag",
        "out_tokens",
        "tpot",
        "ttft",
    )

    def __init__(self) -> None:
        self.completed = 0
        self.failed = 0
        self.in_tokens = 0
        self.out_tokens = 0
        self.ttft = Column()
        self.tpot = Column()
        self.itl = Column()
        self.e2e = Column()
        self.lag = Column()

    def add(self, r: Result) -> None:
        """Count ``r``; latencies only from successful requests, send lag from every one."""
        if r.lag is not None:
            self.lag.add(r.lag)
        if not r.ok:
            self.failed += 1
            return
        self.completed += 1
        self.in_tokens += r.prompt_tokens or 0
        self.out_tokens += r.output_tokens
        self.ttft.add(r.ttft or 0.0)
        if r.e2e is not None:
            self.e2e.add(r.e2e)
        tpot = r.tpot
        if tpot is not None:
            self.tpot.add(tpot)
        self.itl.extend(r.itls)

    def metrics(self, duration: float) -> Metrics:
        """vLLM-named metrics over a run of ``duration`` seconds (latencies in ms)."""
        m: Metrics = {
            "completed": self.completed,
            "failed": self.failed,
            "duration": round(duration, 6),
            "request_throughput": self.completed / duration,
            "output_throughput": self.out_tokens / duration,
            "total_token_throughput": (self.in_tokens + self.out_tokens) / duration,
            "total_input_tokens": self.in_tokens,
            "total_output_tokens": self.out_tokens,
        }
        for name, col, pcts in (
            ("ttft", self.ttft, (50, 95, 99)),
            ("tpot", self.tpot, (50, 95)),
            ("itl", self.itl, (50, 95)),
            ("e2el", self.e2e, (50, 95, 99)),
        ):
            m[f"mean_{name}_ms"] = _ms(col.mean)
            for p, v in zip(pcts, col.quantiles(pcts), strict=True):
                m[f"median_{name}_ms" if p == 50 else f"p{p}_{name}_ms"] = _ms(v)
        for p, v in zip((50, 99), self.lag.quantiles((50, 99)), strict=True):
            m[f"send_lag_p{p}_ms"] = _ms(v)
        return m

    def samples(self, name: str, points: int = 200) -> list[float]:
        """Up to ``points`` evenly spaced order statistics of a latency column, in ms (CDFs)."""
        column: Column = getattr(self, name)
        return [round(v * 1000.0, 3) for v in column.spread(points)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def failure_reason(r: Result) -> str:
    """Why ``r`` failed, without its status: the error's code (or type) and message."""
    err = r.error
    if err is None:
        return "no content" if r.status == 200 else ""
    label = next((v for v in (err.get("code"), err.get("type")) if isinstance(v, str)), "")
    message = err.get("message")
    text = message[:_REASON_CHARS] if isinstance(message, str) else ""
    if text == f"HTTP {r.status}":  # the client's stand-in for an error without a body
        text = ""
    return ": ".join(part for part in (label, text) if part)


class Failures:
    """How many requests failed for which reason (status and :func:`failure_reason`)."""

    __slots__ = ("counts", "other")

    def __init__(self) -> None:
        self.counts: dict[tuple[int, str], int] = {}
        self.other = 0

    def add(self, r: Result) -> None:
        """Count a failed result."""
        key = (r.status, failure_reason(r))
        if key in self.counts or len(self.counts) < REASONS:
            self.counts[key] = self.counts.get(key, 0) + 1
        else:
            self.other += 1

    def to_list(self) -> list[dict[str, Any]]:
        """``[{status, reason, count}]``, most frequent first; status 0: no HTTP answer."""
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        out = [{"status": st, "reason": why, "count": n} for (st, why), n in ranked]
        if self.other:
            out.append({"status": None, "reason": "other reasons", "count": self.other})
        return out


class Agreement:
    """How often a shadow target answered like the primary one."""

    __slots__ = ("compared", "finish_reason", "output_tokens", "status", "text", "text_compared")

    def __init__(self) -> None:
        self.compared = self.status = self.finish_reason = self.output_tokens = 0
        self.text_compared = self.text = 0

    def add(self, a: Result, b: Result, *, deterministic: bool) -> None:
        """Compare one pair; text only for temperature-0 requests."""
        self.compared += 1
        self.status += a.status == b.status
        self.finish_reason += a.finish_reason == b.finish_reason
        self.output_tokens += a.ok and b.ok and a.output_tokens == b.output_tokens
        if deterministic and a.ok and b.ok:
            self.text_compared += 1
            self.text += a.text == b.text

    def to_dict(self) -> dict[str, Any]:
        """Fractions of compared pairs that agreed."""
        n = self.compared or 1
        return {
            "compared": self.compared,
            "status": self.status / n,
            "finish_reason": self.finish_reason / n,
            "output_tokens": self.output_tokens / n,
            "text_compared": self.text_compared,
            "text": self.text / self.text_compared if self.text_compared else None,
        }


class RunReport:
    """Collects one run (one policy) and, with ``--shadow-target``, its shadow.

    A target's duration runs from the run's start to that target's last answer: ``sent``,
    the seconds from the run's start to each request's send, is given with every result (the
    replayer measures it, ``replay merge`` reads it from the results lines, so both compute
    the same figures), and the request ended its E2E later. A slow shadow therefore does not
    stretch the primary's duration, nor lower its throughput. Without any ``sent``,
    :attr:`duration` is used as it was set.

    Besides the summaries the run keeps its requests' figures for pairing with another run
    (:mod:`replay.pairs`), its timeline and slowest requests (:mod:`replay.timeline`) and
    what each backend did (:mod:`replay.cost`). ``aa`` marks the second run of the first
    policy that ``--aa`` adds (see :mod:`replay.compare`).
    """

    def __init__(
        self,
        policy: str | None,
        *,
        shadow_target: str | None = None,
        frame: Frame | None = None,
        aa: bool = False,
    ) -> None:
        self.policy = policy
        self.aa = aa
        self.overall = Acc()
        self.failures = Failures()
        self.by_class: dict[str, Acc] = {}
        self.backends = Backends()
        self.requests = Requests()
        self.timeline = Timeline(frame or Frame())
        self.good: dict[str, list[int]] = {}
        """Per class with an SLO: requests that met it, requests judged."""
        self.shadow_target = shadow_target
        self.shadow = Acc()
        self.shadow_by_class: dict[str, Acc] = {}
        self.agreement = Agreement()
        self.duration = 0.0
        self.shadow_duration = 0.0

    def add(self, r: Result, *, sent: float | None = None) -> None:
        """Account for one primary result, sent ``sent`` seconds into the run."""
        at = 0.0 if sent is None else sent
        if sent is not None:
            self.duration = max(self.duration, sent + (r.e2e or 0.0))
        self.overall.add(r)
        if not r.ok:
            self.failures.add(r)
        self.by_class.setdefault(r.request_class, Acc()).add(r)
        self.backends.add(r, at)
        good = self.timeline.good(r)
        if good is not None:
            tally = self.good.setdefault(r.request_class, [0, 0])
            tally[0] += good
            tally[1] += 1
        self.requests.add(r, good)
        self.timeline.add(r, at)

    def add_shadow(
        self, primary: Result, shadow: Result, *, deterministic: bool, sent: float | None = None
    ) -> None:
        """Account for the shadow target's answer to the same request (sent at ``sent``)."""
        if sent is not None:
            self.shadow_duration = max(self.shadow_duration, sent + (shadow.e2e or 0.0))
        self.shadow.add(shadow)
        self.shadow_by_class.setdefault(primary.request_class, Acc()).add(shadow)
        self.agreement.add(primary, shadow, deterministic=deterministic)

    def to_dict(self) -> dict[str, Any]:
        """The run's entry in ``report.json``."""
        d = max(self.duration, 1e-9)
        good, judged = (sum(t[k] for t in self.good.values()) for k in (0, 1))
        by_class = {}
        for k, v in sorted(self.by_class.items()):
            met, of = self.good.get(k, (0, 0))
            by_class[k] = {**v.metrics(d), "goodput": met / of if of else None}
        run: dict[str, Any] = {
            "policy": self.policy,
            "aa": self.aa,
            "overall": {**self.overall.metrics(d), "goodput": good / judged if judged else None},
            "by_class": by_class,
            "by_backend": self.backends.to_dict(),
            "failures": self.failures.to_list(),
            "timeline": self.timeline.to_dict(d),
            "slowest": self.timeline.slowest(),
            "requests": self.requests.to_dict(),
            "cdf": _cdf(self.overall, self.by_class),
        }
        if self.shadow_target is not None:
            sd = max(self.shadow_duration, 1e-9) if self.shadow_duration else d
            run["shadow"] = {
                "target": self.shadow_target,
                "overall": self.shadow.metrics(sd),
                "by_class": {k: v.metrics(sd) for k, v in sorted(self.shadow_by_class.items())},
                "agreement": self.agreement.to_dict(),
                "cdf": _cdf(self.shadow, self.shadow_by_class),
            }
        return run


def _cdf(overall: Acc, by_class: Mapping[str, Acc]) -> dict[str, dict[str, list[float]]]:
    """The HTML page's CDF points: per group ("all", each class), TTFT and E2E in ms."""
    groups = {"all": overall, **by_class}
    return {
        g: {"ttft": acc.samples("ttft"), "e2e": acc.samples("e2e")} for g, acc in groups.items()
    }

"""Summaries with vLLM's benchmark metric names, the report JSON and the terminal table.

Per-request figures go into :class:`~replay.stats.Column` objects (bounded memory, exact
percentiles up to 20,000 values a column), never into a list of result objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replay.client import Result
from replay.stats import Column

Metrics = dict[str, float | int | None]
REASONS = 16
"""Distinct failure reasons a run tells apart; later ones are counted as one (bounded)."""
_REASON_CHARS = 160
SHOWN_REASONS = 3
"""Reasons the terminal summary names per run (the report JSON has them all)."""


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
        return [v * 1000.0 for v in column.spread(points)]


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

    A target's duration runs from the run's start to that target's last answer: ``end``, the
    seconds from the run's start to the end of each request, is given with every result (the
    replayer measures it, ``replay merge`` reads it from the results lines, so both compute
    the same figures). A slow shadow therefore does not stretch the primary's duration, nor
    lower its throughput. Without any ``end``, :attr:`duration` is used as it was set.
    """

    def __init__(self, policy: str | None, *, shadow_target: str | None = None) -> None:
        self.policy = policy
        self.overall = Acc()
        self.failures = Failures()
        self.by_class: dict[str, Acc] = {}
        self.by_backend: dict[str, int] = {}
        self.shadow_target = shadow_target
        self.shadow = Acc()
        self.shadow_by_class: dict[str, Acc] = {}
        self.agreement = Agreement()
        self.duration = 0.0
        self.shadow_duration = 0.0

    def add(self, r: Result, *, end: float | None = None) -> None:
        """Account for one primary result that ended ``end`` seconds into the run."""
        if end is not None:
            self.duration = max(self.duration, end)
        self.overall.add(r)
        if not r.ok:
            self.failures.add(r)
        self.by_class.setdefault(r.request_class, Acc()).add(r)
        key = r.backend or "none"
        self.by_backend[key] = self.by_backend.get(key, 0) + 1

    def add_shadow(
        self, primary: Result, shadow: Result, *, deterministic: bool, end: float | None = None
    ) -> None:
        """Account for the shadow target's answer to the same request (ended at ``end``)."""
        if end is not None:
            self.shadow_duration = max(self.shadow_duration, end)
        self.shadow.add(shadow)
        self.shadow_by_class.setdefault(primary.request_class, Acc()).add(shadow)
        self.agreement.add(primary, shadow, deterministic=deterministic)

    def to_dict(self) -> dict[str, Any]:
        """The run's entry in ``report.json``."""
        d = max(self.duration, 1e-9)
        run: dict[str, Any] = {
            "policy": self.policy,
            "overall": self.overall.metrics(d),
            "by_class": {k: v.metrics(d) for k, v in sorted(self.by_class.items())},
            "by_backend": {k: {"requests": n} for k, n in sorted(self.by_backend.items())},
            "failures": self.failures.to_list(),
        }
        if self.shadow_target is not None:
            sd = max(self.shadow_duration, 1e-9) if self.shadow_duration else d
            run["shadow"] = {
                "target": self.shadow_target,
                "overall": self.shadow.metrics(sd),
                "by_class": {k: v.metrics(sd) for k, v in sorted(self.shadow_by_class.items())},
                "agreement": self.agreement.to_dict(),
            }
        return run


# (row label, metric key, scale, format) in the order of the public B200 table
_ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("Output throughput (tokens/s)", "output_throughput", 1.0, "{:,.2f}"),
    ("Mean TTFT (s)", "mean_ttft_ms", 0.001, "{:,.3f}"),
    ("P95 TTFT (s)", "p95_ttft_ms", 0.001, "{:,.3f}"),
    ("Mean inter-token latency (ms)", "mean_itl_ms", 1.0, "{:,.2f}"),
    ("Mean TPOT (ms)", "mean_tpot_ms", 1.0, "{:,.2f}"),
    ("Mean end-to-end latency (s)", "mean_e2el_ms", 0.001, "{:,.3f}"),
    ("P95 end-to-end latency (s)", "p95_e2el_ms", 0.001, "{:,.3f}"),
    ("Send lag P99 (ms)", "send_lag_p99_ms", 1.0, "{:,.2f}"),
)


def _cell(m: Mapping[str, Any], key: str, scale: float, fmt: str) -> str:
    v = m.get(key)
    return "-" if v is None else fmt.format(v * scale)


def _table(title: str, columns: list[tuple[str, Mapping[str, Any]]]) -> str:
    rows = [["Metric", *(name for name, _ in columns)]]
    ok = [f"{m['completed']} / {m['completed'] + m['failed']}" for _, m in columns]
    rows.append(["Successful requests", *ok])
    for label, key, scale, fmt in _ROWS:
        rows.append([label, *(_cell(m, key, scale, fmt) for _, m in columns)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(r: list[str]) -> str:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([title, line(rows[0]), sep, *(line(r) for r in rows[1:])])


def _label(run: Mapping[str, Any]) -> str:
    return str(run.get("policy") or "target")


def _scope(report: Mapping[str, Any]) -> str:
    """What the overall table covers: the mode and target, or the merged files."""
    merged = report.get("merged_from")
    if merged is not None:
        return f"merged from {len(merged)} results file{'' if len(merged) == 1 else 's'}"
    return ", ".join(str(report[k]) for k in ("mode", "target") if report.get(k) is not None)


def render_tables(report: Mapping[str, Any]) -> str:
    """The terminal report: overall table, one table per class, shadow agreement lines."""
    runs = report["runs"]
    cols: list[tuple[str, Mapping[str, Any]]] = []
    for run in runs:
        cols.append((_label(run), run["overall"]))
        if "shadow" in run:
            cols.append((_label(run) + " (shadow)", run["shadow"]["overall"]))
    out = [_table(f"All requests ({_scope(report)})", cols)]
    classes = sorted({c for run in runs for c in run["by_class"]})
    for cls in classes:
        cols = []
        for run in runs:
            if cls in run["by_class"]:
                cols.append((_label(run), run["by_class"][cls]))
            if cls in run.get("shadow", {}).get("by_class", {}):
                cols.append((_label(run) + " (shadow)", run["shadow"]["by_class"][cls]))
        out.append(_table(f"Class {cls}", cols))
    for run in runs:
        if "shadow" in run:
            a = run["shadow"]["agreement"]
            text = "n/a" if a["text"] is None else f"{a['text']:.1%} of {a['text_compared']}"
            out.append(
                f"Shadow agreement ({_label(run)} vs {run['shadow']['target']}, "
                f"{a['compared']} pairs): status {a['status']:.1%}, finish_reason "
                f"{a['finish_reason']:.1%}, output tokens {a['output_tokens']:.1%}, "
                f"text at temperature 0 {text}"
            )
    out.extend(_failure_summary(run) for run in runs if run["overall"]["failed"])
    return "\n\n".join(out)


def _failure_summary(run: Mapping[str, Any]) -> str:
    """``POLICY: F of N requests failed`` and the most frequent reasons with their counts."""
    m = run["overall"]
    lines = [f"{_label(run)}: {m['failed']} of {m['completed'] + m['failed']} requests failed"]
    reasons = run.get("failures", [])
    for entry in reasons[:SHOWN_REASONS]:
        status = entry["status"]
        said = " ".join(
            part for part in (f"HTTP {status}" if status else "", entry["reason"]) if part
        )
        lines.append(f"  {entry['count']:>6}  {said or 'no HTTP answer'}")
    rest = reasons[SHOWN_REASONS:]
    if rest:
        n = sum(e["count"] for e in rest)
        lines.append(f"  {n:>6}  other reasons")
    return "\n".join(lines)


def failed_runs(report: Mapping[str, Any]) -> list[str]:
    """The runs in which every request failed (a run with no requests has not failed)."""
    return [
        _label(run)
        for run in report["runs"]
        if run["overall"]["completed"] == 0 and run["overall"]["failed"] > 0
    ]

"""The terminal report: the verdict lines, what was replayed how, then the tables.

The tables come per class first (interactive and batch traffic are different questions, so
a table mixing them comes last), one column per run, the rows of the public B200 table in
the report's own units (latencies in ms everywhere, as in the HTML page, which draws its
tables from the same :data:`ROWS`); in each row the best run's cell is marked ``*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replay.order import order_text

Row = tuple[str, str, str, int]
"""(label, metric key, number format, direction: 1 higher is better, -1 lower, 0 neither)."""
ROWS: tuple[Row, ...] = (
    ("Output throughput (tokens/s)", "output_throughput", "{:,.2f}", 1),
    ("Mean TTFT (ms)", "mean_ttft_ms", "{:,.1f}", -1),
    ("P95 TTFT (ms)", "p95_ttft_ms", "{:,.1f}", -1),
    ("Mean ITL (ms)", "mean_itl_ms", "{:,.2f}", -1),
    ("Mean TPOT (ms)", "mean_tpot_ms", "{:,.2f}", -1),
    ("Mean E2E (ms)", "mean_e2el_ms", "{:,.1f}", -1),
    ("P95 E2E (ms)", "p95_e2el_ms", "{:,.1f}", -1),
    ("SLO attainment", "goodput", "{:.1%}", 1),
    ("Cost (USD / 1M output tokens)", "usd_per_1m_output", "{:,.2f}", -1),
    ("Send lag P99 (ms)", "send_lag_p99_ms", "{:,.2f}", 0),
)
SHOWN_REASONS = 3
"""Reasons the terminal summary names per run (the report JSON has them all)."""

Column = tuple[str, Mapping[str, Any]]


def label(run: Mapping[str, Any]) -> str:
    """A run's column title."""
    return str(run.get("policy") or "target")


def best(values: Sequence[float | None], direction: int) -> int | None:
    """Which of ``values`` is best in a row (None: no direction, fewer than two, or a tie)."""
    got = [(v, i) for i, v in enumerate(values) if v is not None]
    if direction == 0 or len(got) < 2:
        return None
    top = max(got) if direction > 0 else min(got)
    return None if sum(v == top[0] for v, _ in got) > 1 else top[1]


@dataclass(frozen=True, slots=True)
class Table:
    """A table as both the terminal and the HTML page show it: cells as text, and per row
    which cell holds the row's best value (None: none is)."""

    title: str
    head: list[str]
    rows: list[list[str]]
    best: list[int | None]

    def to_dict(self) -> dict[str, Any]:
        """The page's form of it."""
        return {"title": self.title, "head": self.head, "rows": self.rows, "best": self.best}

    def text(self) -> str:
        """The terminal's form: aligned columns, ``*`` after each row's best value."""
        rows = [self.head]
        for row, top in zip(self.rows, self.best, strict=True):
            rows.append([c + " *" if k == top else c for k, c in enumerate(row)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.head))]

        def line(r: list[str]) -> str:
            cells = [r[0].ljust(widths[0])]
            cells += [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
            return "| " + " | ".join(cells) + " |"

        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([self.title, line(rows[0]), sep, *(line(r) for r in rows[1:])])


def metric_table(title: str, columns: Sequence[Column]) -> Table:
    """One class's (or all requests') figures, one column per run, :data:`ROWS` as rows."""
    rows = [
        [
            "Successful requests",
            *(f"{m['completed']} / {m['completed'] + m['failed']}" for _, m in columns),
        ]
    ]
    marks: list[int | None] = [None]
    twins = [bool(m.get("aa")) for _, m in columns]
    for text, key, fmt, direction in ROWS:
        values = [m.get(key) for _, m in columns]
        if all(v is None for v in values) and key in ("goodput", "usd_per_1m_output"):
            continue  # no SLO, no prices: no row
        rows.append([text, *("-" if v is None else fmt.format(v) for v in values)])
        # an A/A run is the baseline's twin, not a contender
        contenders = [None if aa else v for v, aa in zip(values, twins, strict=True)]
        top = best(contenders, direction) if len(columns) > 1 else None
        shown = rows[-1][1:]
        if top is not None and any(  # a tie as shown is a tie
            k != top and c is not None and shown[k] == shown[top] for k, c in enumerate(contenders)
        ):
            top = None
        marks.append(None if top is None else top + 1)
    return Table(title, ["Metric", *(name for name, _ in columns)], rows, marks)


def metric_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per class, then all requests (classes mixed)."""
    runs = report["runs"]
    classes = sorted({c for run in runs for c in run["by_class"]})
    out = [metric_table(f"Class {cls}", _columns(runs, cls)) for cls in classes]
    mixed = " (classes mixed)" if len(classes) > 1 else ""
    out.append(metric_table(f"All requests{mixed}", _columns(runs, None)))
    return out


def header(report: Mapping[str, Any]) -> str:
    """What was replayed against what, how fast, over which stretch, in which windows."""
    merged = report.get("merged_from")
    if merged is not None:
        return f"merged from {len(merged)} results file{'' if len(merged) == 1 else 's'}"
    compared = report.get("compared")
    if compared is not None:
        return f"{compared[1]} compared against {compared[0]}, requests of {report.get('file')}"
    parts = [f"{report.get('file')} ({report.get('format')}) against {report.get('target')}"]
    speed = report.get("speed")
    if report.get("mode") == "closed":
        parts.append(f"closed loop, concurrency {report.get('concurrency')}")
    elif speed is not None:
        parts.append(f"{report.get('mode')}, speed {speed:g}x")
    window = report.get("window")
    if window:
        end = "end" if window[1] is None else f"{window[1]:g} s"
        parts.append(f"trace {window[0]:g} s to {end}")
    runs = report.get("runs") or []
    timeline = runs[0].get("timeline") if runs else None
    if timeline:
        parts.append(f"timeline windows {timeline['window_s']:g} s of the trace")
    return ", ".join(parts)


def _columns(runs: Sequence[Mapping[str, Any]], cls: str | None) -> list[Column]:
    """Each run's (and shadow's) figures for class ``cls`` (None: all requests), with its
    cost per million output tokens."""
    out: list[Column] = []
    for run in runs:
        cost = run.get("cost") or {}
        unit = (cost.get("by_class", {}).get(cls) or {}) if cls else cost
        group = run["overall"] if cls is None else run["by_class"].get(cls)
        if group is not None:
            per_token = unit.get("usd_per_1m_output")
            out.append((label(run), {**group, "usd_per_1m_output": per_token, "aa": run.get("aa")}))
        shadow = run.get("shadow")
        if shadow is not None:
            sgroup = shadow["overall"] if cls is None else shadow["by_class"].get(cls)
            if sgroup is not None:
                out.append((label(run) + " (shadow)", sgroup))
    return out


def render_tables(report: Mapping[str, Any]) -> str:
    """The whole terminal report (see the module doc)."""
    runs = report["runs"]
    comparison = report.get("comparison") or {}
    out = [*comparison.get("lines", ())]
    lead = [header(report)]
    order = report.get("order")
    if order and len(runs) > 1:
        lead.append("Order: " + order_text(order))
    caches = report.get("prefix_caches")
    if caches:
        lead.append("Prefix caches: " + caches["handling"])
    out.append("\n".join(lead))
    out += [t.text() for t in metric_tables(report)]
    for run in runs:
        if "shadow" in run:
            a = run["shadow"]["agreement"]
            text = "n/a" if a["text"] is None else f"{a['text']:.1%} of {a['text_compared']}"
            out.append(
                f"Shadow agreement ({label(run)} vs {run['shadow']['target']}, "
                f"{a['compared']} pairs): status {a['status']:.1%}, finish_reason "
                f"{a['finish_reason']:.1%}, output tokens {a['output_tokens']:.1%}, "
                f"text at temperature 0 {text}"
            )
    out.extend(_failure_summary(run) for run in runs if run["overall"]["failed"])
    return "\n\n".join(out)


def _failure_summary(run: Mapping[str, Any]) -> str:
    """``POLICY: F of N requests failed`` and the most frequent reasons with their counts."""
    m = run["overall"]
    lines = [f"{label(run)}: {m['failed']} of {m['completed'] + m['failed']} requests failed"]
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
        label(run)
        for run in report["runs"]
        if run["overall"]["completed"] == 0 and run["overall"]["failed"] > 0
    ]

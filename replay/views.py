"""The HTML page's tables besides the per-class figures: the comparison, what each backend
served, the slowest requests, and cost. Each is a :class:`~replay.tables.Table`, its cells
already text, so the page only lays them out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replay.compare import REST, SHORT, TTFT, percent
from replay.tables import Table, label


def _ms(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _value(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric in ("goodput", "success_rate"):
        return f"{v:.1%}"
    if metric == "output_throughput":
        return f"{v:,.2f} tok/s"
    return f"{v:,.1f} ms"


def comparison_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per candidate: each class's and all requests' headline metrics, both runs' values,
    the change with its 95% interval, the A/A noise floor and the verdict."""
    doc = report.get("comparison")
    if not doc:
        return []
    out = []
    for cand in doc["candidates"]:
        rows = []
        for group, figures in cand["groups"].items():
            for metric, e in figures.items():
                ci = e["ci"]
                change = "-" if e["ratio"] is None else percent(e["ratio"])
                if ci is not None and e["ratio"] is not None:
                    change += f" [{percent(ci[0])}, {percent(ci[1])}]"
                noise = "-" if e["noise"] is None else "±" + percent(1.0 + e["noise"])[1:]
                rows.append(
                    [
                        "all requests" if group == "overall" else group,
                        SHORT[metric],
                        _value(metric, e["baseline"]),
                        _value(metric, e["candidate"]),
                        change,
                        noise,
                        e["verdict"] or "not measured",
                    ]
                )
        title = f"{cand['run']} against {cand['baseline']} ({cand['matched']} requests paired)"
        head = ["Class", "Metric", cand["baseline"], cand["run"], "Change [95% CI]"]
        out.append(Table(title, [*head, "A/A noise", "Verdict"], rows, [None] * len(rows)))
    return out


def backend_tables(report: Mapping[str, Any]) -> list[Table]:
    """One table: per run, backend and class, the requests and tokens served and their
    share of the class's in that run; the backend's busy time on its first row."""
    rows = []
    for run in report["runs"]:
        backends = run.get("by_backend") or {}
        totals: dict[str, list[int]] = {}
        for b in backends.values():
            for cls, c in b.get("by_class", {}).items():
                t = totals.setdefault(cls, [0, 0])
                t[0] += c["requests"]
                t[1] += c["prompt_tokens"] + c["output_tokens"]
        for name, b in backends.items():
            for k, (cls, c) in enumerate(b.get("by_class", {}).items()):
                n, tokens = c["requests"], c["prompt_tokens"] + c["output_tokens"]
                req_total, tok_total = totals[cls]
                rows.append(
                    [
                        label(run),
                        name,
                        cls,
                        f"{n:,}",
                        f"{n / req_total:.1%}" if req_total else "-",
                        f"{tokens:,}",
                        f"{tokens / tok_total:.1%}" if tok_total else "-",
                        f"{c['cached_tokens']:,}",
                        "" if k else f"{b['busy_s']:,.1f}",
                    ]
                )
    head = ["Run", "Backend", "Class", "Requests", "Share", "Tokens", "Share", "Cached tokens"]
    title = "Requests and tokens (prompt and output) per backend, shares of the class's"
    return [Table(title, [*head, "Busy (s)"], rows, [None] * len(rows))] if rows else []


def slowest_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per run: its requests with the longest TTFT in each class."""
    out = []
    for run in report["runs"]:
        rows = [
            [
                e["custom_id"],
                e["class"],
                e["backend"] or "-",
                "-" if e["attempts"] is None else str(e["attempts"]),
                _ms(e["ttft_ms"]),
                _ms(e["e2e_ms"]),
                "-" if e["prompt_tokens"] is None else f"{e['prompt_tokens']:,}",
                "-" if e["cached_tokens"] is None else f"{e['cached_tokens']:,}",
                f"{e['output_tokens']:,}",
                f"{e['sent_s']:,.1f}",
            ]
            for e in run.get("slowest") or ()
        ]
        head = ["Request", "Class", "Backend", "Attempts", "TTFT (ms)", "E2E (ms)"]
        head += ["Prompt tokens", "Cached tokens", "Output tokens", "Sent at (trace s)"]
        out.append(Table(label(run), head, rows, [None] * len(rows)))
    return out


def _usd(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def cost_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per run and class: dollars, dollars per million output tokens, what cache hits saved;
    then each backend's busy time, price and cost."""
    priced = [(run, run["cost"]) for run in report["runs"] if run.get("cost")]
    if not priced:
        return []
    rows, busy = [], []
    noted = False  # a column of notes only where some backend has no price
    for run, cost in priced:
        for cls, c in [*cost["by_class"].items(), ("all requests", cost)]:
            missing = ", ".join(c["unpriced"])
            rows.append(
                [
                    label(run),
                    cls,
                    _usd(c["usd"]),
                    _usd(c["usd_per_1m_output"], 2),
                    _usd(c["saved_usd"]),
                    f"no price for {missing}" if missing else "",
                ]
            )
            noted = noted or bool(missing)
        for name, b in cost["by_backend"].items():
            busy.append(
                [
                    label(run),
                    name,
                    f"{b['busy_s']:,.1f}",
                    f"{b['usd_per_hour']:,.2f}",
                    _usd(b["usd"]),
                ]
            )
    head = ["Run", "Class", "USD", "USD / 1M output tokens", "Cache hits saved (USD)", "Note"]
    if not noted:
        head, rows = head[:-1], [row[:-1] for row in rows]
    return [
        Table("Cost per class", head, rows, [None] * len(rows)),
        Table(
            "Busy time per backend (at least one request in flight), priced",
            ["Run", "Backend", "Busy (s)", "USD / hour", "USD"],
            busy,
            [None] * len(busy),
        ),
    ]


def simulator_tables(report: Mapping[str, Any]) -> list[Table]:
    """Per live-simulated pair: the simulator's error per class, TTFT's figures in a table of
    their own, then the others (``replay compare`` of a live and a simulated report)."""
    out = []
    for entry in report.get("simulator_error") or ():
        for title, metrics in (("TTFT", TTFT), ("other metrics", REST)):
            rows = []
            for group, got in entry["groups"].items():
                cells = []
                for m in metrics:
                    e = got.get(m)
                    if e is None:
                        cells.append("-")
                        continue
                    text = percent(1.0 + e["error"])
                    if e["ci"] is not None:
                        text += f" [{percent(1.0 + e['ci'][0])}, {percent(1.0 + e['ci'][1])}]"
                    cells.append(text)
                rows.append(["all requests" if group == "overall" else group, *cells])
            head = ["Class", *(SHORT[m] for m in metrics)]
            name = f"{entry['simulated']} against {entry['live']}: error in {title} [95% CI]"
            out.append(Table(name, head, rows, [None] * len(rows)))
    return out


def tables(report: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every table of the page by section, in the page's form."""
    return {
        name: [t.to_dict() for t in make(report)]
        for name, make in (
            ("comparison", comparison_tables),
            ("simulator", simulator_tables),
            ("backends", backend_tables),
            ("slowest", slowest_tables),
            ("cost", cost_tables),
        )
    }

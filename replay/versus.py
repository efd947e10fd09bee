"""``replay compare A.json B.json``: two saved reports of one trace, compared as runs are.

Before and after an engine upgrade, one target against another, or a live replay against
``replay simulate`` of the same trace: each run of B is paired with A's run of the same name
(or, when each report holds one run, with that run), request by request, as
:mod:`replay.compare` pairs the runs of one report; the noise floor is that of A's A/A run,
else B's, else none. Runs are named ``A: name`` and ``B: name`` after the files' stems
(``first`` and ``second`` when the stems are the same).

When one report is simulated and the other is not, the comparison is also the simulator's
error: per class and metric, simulated against live, with its interval; TTFT apart from the
rest, as simulators are judged on it separately (it is what a simulator gets wrong first:
queueing at the prefill).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from replay.bootstrap import RESAMPLES
from replay.compare import REST, SHORT, TTFT, comparison, percent, price_runs
from replay.options import HelpFormatter, add_price_option, write_outputs
from replay.tables import label, render_tables


def _load(path: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ValueError(f"{path}: not a replay report (no runs)")
    for run in doc["runs"]:
        if not isinstance(run, dict) or not isinstance(run.get("requests"), dict):
            raise ValueError(
                f"{path}: run {label(run) if isinstance(run, dict) else '?'} has no per-request "
                "figures to pair (a report written before replay kept them): replay it again"
            )
    return doc


def _names(a: str, b: str) -> tuple[str, str]:
    sa, sb = Path(a).stem, Path(b).stem
    return (sa, sb) if sa != sb else ("first", "second")


def pairs_of(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> list[tuple[int, int]]:
    """Indices of (A's run, B's run) to compare: the same name, else one run each."""
    names = {label(r): i for i, r in enumerate(a) if not r.get("aa")}
    out = [(names[label(r)], j) for j, r in enumerate(b) if not r.get("aa") and label(r) in names]
    if not out and len(a) == 1 and len(b) == 1:
        out = [(0, 0)]
    return out


def combine(path_a: str, path_b: str, *, resamples: int = RESAMPLES) -> dict[str, Any]:
    """The report of ``replay compare``: both reports' runs, renamed, and their comparison."""
    a, b = _load(path_a), _load(path_b)
    pairs = pairs_of(a["runs"], b["runs"])
    if not pairs:
        names = ", ".join(sorted({label(r) for r in a["runs"]}))
        raise ValueError(f"{path_b} has no run named as one of {path_a}'s ({names})")
    na, nb = _names(path_a, path_b)
    runs_a = [{**r, "policy": f"{na}: {label(r)}"} for r in a["runs"]]
    runs_b = [{**r, "policy": f"{nb}: {label(r)}"} for r in b["runs"]]
    # A's runs first: its A/A run, if any, sets the noise floor, else B's
    doc = comparison(
        [*runs_a, *runs_b], pairs=[(runs_a[i], runs_b[j]) for i, j in pairs], resamples=resamples
    )
    report: dict[str, Any] = {
        "file": a.get("file"),
        "format": a.get("format"),
        "target": f"{a.get('target')} / {b.get('target')}",
        "mode": "compared",
        "compared": [path_a, path_b],
        "speed": a.get("speed"),
        "window": a.get("window"),
        "slo": a.get("slo") or b.get("slo"),
        "runs": [*runs_a, *runs_b],
        "comparison": doc,
    }
    sims = (bool(a.get("simulated")), bool(b.get("simulated")))
    if doc is not None and sims[0] != sims[1]:
        report["simulator_error"] = simulator_error(doc, live_first=not sims[0])
    return report


def simulator_error(doc: Mapping[str, Any], *, live_first: bool) -> list[dict[str, Any]]:
    """Per pair and class: simulated against live for each metric, ``(sim - live) / live``
    with its interval (the comparison's ratio minus 1, flipped when A is the simulated)."""
    out = []
    for cand in doc["candidates"]:
        groups: dict[str, dict[str, Any]] = {}
        for group, figures in cand["groups"].items():
            got: dict[str, Any] = {}
            for metric in (*TTFT, *REST):
                ratio, ci = figures[metric]["ratio"], figures[metric]["ci"]
                if ratio is not None and not live_first:  # the simulated run is A: invert
                    ratio = 1.0 / ratio
                    ci = None if ci is None else [1.0 / ci[1], 1.0 / ci[0]]
                got[metric] = (
                    None
                    if ratio is None
                    else {"error": ratio - 1.0, "ci": None if ci is None else [c - 1 for c in ci]}
                )
            groups[group] = got
        runs = cand["baseline"], cand["run"]
        live, sim = runs if live_first else runs[::-1]
        out.append({"live": live, "simulated": sim, "groups": groups})
    return out


def error_lines(panel: Sequence[Mapping[str, Any]]) -> list[str]:
    """The panel in the terminal: per pair and class, TTFT's errors, then the others'."""
    lines = []
    for entry in panel:
        lines.append(f"Simulated ({entry['simulated']}) against live ({entry['live']}):")
        for group, got in entry["groups"].items():
            for title, metrics in (("TTFT", TTFT), ("other", REST)):
                said = [
                    f"{SHORT[m]} {percent(1.0 + got[m]['error'])}"
                    for m in metrics
                    if got.get(m) is not None
                ]
                if said:
                    lines.append(f"  {group} {title}: " + ", ".join(said))
    return lines


def main(argv: list[str]) -> int:
    """``replay compare A.json B.json [--out C.json] [--html C.html] [--price B=USD]``."""
    p = argparse.ArgumentParser(
        prog="replay compare",
        description="Compare two saved reports of one trace: paired by request, with 95% "
        "intervals, A's A/A noise floor and verdicts; the simulator's error for live "
        "against simulated.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("baseline", metavar="A.json", help="the report compared against")
    p.add_argument("candidate", metavar="B.json", help="the report compared")
    p.add_argument("--out", metavar="report.json", help="the comparison's report JSON")
    p.add_argument("--html", metavar="report.html", help="self-contained page")
    add_price_option(p)
    a = p.parse_args(argv)
    try:
        report = combine(a.baseline, a.candidate)
    except (OSError, ValueError) as e:
        print(f"replay compare: {e}", file=sys.stderr)
        return 2
    if a.prices:  # else each run keeps the cost its own report gave it
        price_runs(report, dict(a.prices))
    print(render_tables(report))
    for line in error_lines(report.get("simulator_error") or []):
        print(line)
    write_outputs(report, a.out, a.html)
    return 0

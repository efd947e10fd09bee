"""``replay merge``: one report from the ``--results`` files of several replay processes.

A trace too large for one load generator is split with ``--shard I/N`` (for instance by a
Kubernetes Indexed Job; a simulation, with ``--time-shard I/N``). Each shard writes its
per-request results; merging recomputes every figure from those lines, so percentiles are
exact, not averages of averages. Shards are taken to have started together: a run's duration
is the latest ``t_offset_ms + e2e_ms`` over all of its lines (each shard's offsets count from
that shard's own start), as the replay's own report computes it, so merging one replay's
results gives its report's figures back. Runs keep the order in which they first appear (the
order the replay ran them in).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from replay.client import Result, request_class
from replay.compare import AA_SUFFIX, annotate
from replay.options import HelpFormatter, add_report_options, write_outputs
from replay.report import RunReport
from replay.tables import render_tables
from replay.timeline import Frame, window_seconds
from turnout.common.capture import CaptureFormatError, CaptureRecord, parse_line


def _result(rec: CaptureRecord) -> Result:
    resp, obs, route = rec.resp, rec.obs, rec.route
    if resp is None or resp.status is None:
        raise CaptureFormatError("not a replay result: no resp.status")

    def sec(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    return Result(
        custom_id=rec.custom_id,
        request_class=request_class(rec),
        status=resp.status,
        stream=resp.stream,
        lag=sec(obs.send_lag_ms) if obs else None,
        backend=route.backend if route else None,
        policy=route.policy if route else None,
        ttft=sec(obs.ttft_ms) if obs else None,
        e2e=sec(obs.e2e_ms) if obs else None,
        itls=[x / 1000.0 for x in obs.itl_ms] if obs and obs.itl_ms else [],
        prompt_tokens=resp.prompt_tokens,
        completion_tokens=resp.completion_tokens,
        finish_reason=resp.finish_reason,
        error=resp.error,
        attempts=route.failovers + 1 if route else None,
        cached_tokens=resp.cached_tokens,
    )


def _records(paths: Iterable[str]) -> Iterator[tuple[str, int, CaptureRecord]]:
    for path in paths:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield path, n, parse_line(line)


def _span(paths: list[str]) -> float:
    """The latest send in ``paths``, seconds from the runs' start (a first pass)."""
    return max(((rec.t_offset_ms or 0.0) / 1e3 for _, _, rec in _records(paths)), default=0.0)


def merge_runs(paths: list[str], window_s: float | None = None) -> list[RunReport]:
    """The runs of the union of ``paths``; raises ValueError on a bad line. Their timelines
    are on the replay's clock, in windows ``window_s`` wide (default: fitted to it)."""
    runs: dict[str | None, RunReport] = {}  # in order of first appearance
    try:
        frame = Frame(window_seconds(_span(paths), window_s))
        for path, n, rec in _records(paths):
            try:
                r = _result(rec)
            except CaptureFormatError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            run = runs.get(r.policy)
            if run is None:
                aa = (r.policy or "").endswith(AA_SUFFIX)
                run = runs[r.policy] = RunReport(r.policy, frame=frame, aa=aa)
            run.add(r, sent=(rec.t_offset_ms or 0.0) / 1e3)
    except CaptureFormatError as e:
        raise ValueError(str(e)) from None
    return list(runs.values())


def merged_report(
    paths: list[str], runs: list[RunReport], prices: Mapping[str, float]
) -> dict[str, Any]:
    """The ``report.json`` of ``runs``, merged from ``paths``, costs at ``prices``."""
    report = {
        "file": None,
        "format": "results",
        "merged_from": paths,
        "target": None,
        "mode": "merged",
        "speed": None,
        "runs": [run.to_dict() for run in runs],
    }
    return annotate(report, prices)


def main(argv: list[str]) -> int:
    """``replay merge RESULTS... [--out report.json] [--html report.html]``."""
    p = argparse.ArgumentParser(
        prog="replay merge",
        description="One report from several --results files (shards).",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "results", nargs="+", metavar="RESULTS.jsonl", help="replay's or simulate's --results"
    )
    p.add_argument("--out", metavar="report.json", help="report JSON (vLLM metric names)")
    p.add_argument("--html", metavar="report.html", help="self-contained page with CDF plots")
    add_report_options(p)
    a = p.parse_args(argv)
    try:
        runs = merge_runs(a.results, a.window_seconds)
    except (OSError, ValueError) as e:
        print(f"replay merge: {e}", file=sys.stderr)
        return 2
    report = merged_report(a.results, runs, dict(a.prices))
    print(render_tables(report))
    write_outputs(report, a.out, a.html)
    return 0

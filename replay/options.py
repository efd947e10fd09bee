"""The options ``replay`` and ``replay simulate`` share: defined once, so they mean the same.

Both commands read a file through the same schedule (:class:`~replay.plan.PlanOptions`) and
write the same outputs; only where the requests go differs (a live target, or the router's
policies over engine models in virtual time). ``--dry-run`` prints that schedule in both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from replay.html import render_html
from replay.plan import Plan, PlanOptions, dry_run
from replay.replayer import dumps_report
from replay.sources import FORMATS, SESSION_MODES, Source
from replay.tables import failed_runs


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, quiet about options whose default is "not given"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def window(text: str) -> tuple[float, float | None]:
    """``START:END`` seconds of a trace (END may be empty: to the end)."""
    start, sep, end = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected START:END in seconds (END may be empty)")
    try:
        lo = float(start) if start else 0.0
        hi = float(end) if end else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"not numbers: {text!r}") from None
    if lo < 0 or (hi is not None and hi <= lo):
        raise argparse.ArgumentTypeError("need 0 <= START < END")
    return lo, hi


def shard(text: str) -> tuple[int, int]:
    """``I/N`` with ``0 <= I < N``."""
    i, sep, n = text.partition("/")
    try:
        pair = int(i), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError("expected I/N, e.g. 0/4") from None
    if not sep or not 0 <= pair[0] < pair[1]:
        raise argparse.ArgumentTypeError("need 0 <= I < N")
    return pair


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """A number above 0 of ``kind``."""

    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return v

    return parse


def price(text: str) -> tuple[str, float]:
    """``BACKEND=USD_PER_HOUR``."""
    name, sep, usd = text.partition("=")
    try:
        value = float(usd)
    except ValueError:
        value = -1.0
    if not sep or not name or not value >= 0:
        raise argparse.ArgumentTypeError(f"expected BACKEND=USD_PER_HOUR, got {text!r}")
    return name, value


def add_report_options(p: argparse.ArgumentParser) -> None:
    """``--window-seconds`` and ``--price``: how the report reads the runs over time and
    prices them (also ``replay merge``'s)."""
    p.add_argument(
        "--window-seconds",
        type=positive(float),
        metavar="S",
        help="the timeline's windows, seconds of the trace (default: fitted to its length)",
    )
    add_price_option(p)


def add_price_option(p: argparse.ArgumentParser) -> None:
    """``--price BACKEND=USD``, repeatable (also ``replay compare``'s)."""
    p.add_argument(
        "--price",
        type=price,
        action="append",
        default=[],
        dest="prices",
        metavar="BACKEND=USD",
        help="what a backend costs an hour, over the router config's pricing (repeatable)",
    )


def add_common_options(p: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    """The file, policies, schedule, sessions, outputs, ``--dry-run`` and ``--no-progress``.

    Returns the group ``--speed`` is in, for an option that excludes it (``replay``'s
    ``--concurrency``).
    """
    p.add_argument("file", help="capture, Mooncake, Azure, BurstGPT or OpenAI Batch file")
    p.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="one run per named policy, checked against the router's policies before the "
        "first request (without: one run, routed as the router decides)",
    )
    p.add_argument("--format", choices=FORMATS, help="override content detection")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--speed", type=positive(float), default=1.0, metavar="X", help="offsets divided by X"
    )
    p.add_argument(
        "--rate", type=positive(float), metavar="R", help="requests/s for files without times"
    )
    p.add_argument("--max-requests", type=positive(int), metavar="N", help="stop after N")
    p.add_argument("--max-gap", type=positive(float), metavar="SECONDS", help="cap idle gaps")
    p.add_argument("--window", type=window, metavar="START:END", help="seconds of the trace")
    p.add_argument(
        "--shard",
        type=shard,
        metavar="I/N",
        help="only the requests whose custom_id hashes to I of N, as each of N load generators "
        "sharing one trace sends",
    )
    p.add_argument(
        "--sessions",
        choices=SESSION_MODES,
        default="auto",
        help="conversations: rows naming a session (auto), also Mooncake rows extending an "
        "earlier prompt (infer), or none (off)",
    )
    add_report_options(p)
    p.add_argument("--out", metavar="report.json", help="report JSON (vLLM metric names)")
    p.add_argument("--results", metavar="results.jsonl", help="one capture line per request")
    p.add_argument("--html", metavar="report.html", help="self-contained page with CDF plots")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan; nothing is sent or simulated"
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress line (replay draws one on a terminal; simulate never does)",
    )
    return mode


def plan_options(a: argparse.Namespace) -> PlanOptions:
    """The schedule the common options ask for."""
    return PlanOptions(
        speed=a.speed,
        max_gap=a.max_gap,
        window=a.window,
        max_requests=a.max_requests,
        shard=a.shard,
        rate=a.rate,
    )


def print_plan(a: argparse.Namespace, model: str, concurrency: int | None = None) -> None:
    """What ``--dry-run`` prints: the schedule the common options make of the file."""
    src = Source(a.file, a.format, model=model, sessions=a.sessions)
    stats = dry_run(Plan(src, plan_options(a)))
    print(f"file        {src.path} ({src.format})")
    print(f"requests    {stats.requests} (skipped rows: {src.skipped})")
    if concurrency:
        print(f"mode        closed loop, concurrency {concurrency}")
    else:
        print(f"duration    {stats.duration:.3f} s planned")
        print(f"rate        mean {stats.mean_rate:.2f}/s, peak {stats.peak_rate:.0f}/s (1 s bins)")
        print(f"largest gap {stats.largest_gap:.3f} s")
    print(f"out of order rows {stats.out_of_order}; rows without times {stats.untimed}")


def write_outputs(
    report: dict[str, Any], out: str | None, page: str | None, *, extra: str = ""
) -> None:
    """``--out`` (the report JSON) and ``--html`` (the page, ``extra`` markup added)."""
    for path in (out, page):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if out:
        Path(out).write_bytes(dumps_report(report))
    if page:
        text = render_html(report, extra=extra)
        Path(page).write_text(text, encoding="utf-8")


def exit_status(prog: str, report: Mapping[str, Any]) -> int:
    """1 (saying so) when every request of a run failed, else 0."""
    failed = failed_runs(report)
    if not failed:
        return 0
    what = "every request" if len(report["runs"]) == 1 else f"every request of {', '.join(failed)}"
    print(f"{prog}: {what} failed; the reasons are above", file=sys.stderr)
    return 1

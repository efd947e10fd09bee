"""`replay` (also `turnout replay`): ``replay FILE [options]`` and its subcommands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import uvloop

from replay.html import collect_samples, render_html
from replay.merge import main as merge_main
from replay.plan import Plan, PlanOptions, dry_run
from replay.replayer import Replayer, ReplayOptions, build_report, dumps_report
from replay.report import render_tables
from replay.sources import FORMATS, SESSION_MODES, Format, Source, SourceError, detect_format
from replay.synth import PromptSynth
from turnout.common.capture import dump_line


def _window(text: str) -> tuple[float, float | None]:
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


def _shard(text: str) -> tuple[int, int]:
    i, sep, n = text.partition("/")
    try:
        shard = int(i), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError("expected I/N, e.g. 0/4") from None
    if not sep or not 0 <= shard[0] < shard[1]:
        raise argparse.ArgumentTypeError("need 0 <= I < N")
    return shard


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return v

    return parse


def add_sessions_option(p: argparse.ArgumentParser) -> None:
    """``--sessions``: which rows replay as conversations (see replay.sessions)."""
    p.add_argument(
        "--sessions",
        choices=SESSION_MODES,
        default="auto",
        help="conversations: rows naming a session (auto), also Mooncake rows extending an "
        "earlier prompt (infer), or none (off)",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replay",
        description="Replay a capture or a public trace against an OpenAI-compatible target.",
        epilog=(
            "Also: replay convert FILE -o CAPTURE [--format F] (any trace -> capture.jsonl); "
            "replay merge RESULTS... [--out report.json] (one report from shards' results); "
            "replay simulate FILE [--config C] [--policy P]... [--set KEY=V1,V2] (virtual time)"
        ),
    )
    p.add_argument("file", help="capture, Mooncake, Azure, BurstGPT or OpenAI Batch file")
    p.add_argument("--target", default="http://127.0.0.1:8080", help="OpenAI-compatible base URL")
    p.add_argument(
        "--policy", action="append", dest="policies", metavar="NAME", help="one run each"
    )
    p.add_argument("--format", choices=FORMATS, help="override content detection")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--speed", type=_positive(float), default=1.0, help="offsets divided by X")
    mode.add_argument("--concurrency", type=_positive(int), help="closed loop, N in flight")
    p.add_argument("--rate", type=_positive(float), help="requests/s for files without times")
    p.add_argument("--max-requests", type=_positive(int), metavar="N")
    p.add_argument("--max-gap", type=_positive(float), metavar="SECONDS", help="cap idle gaps")
    p.add_argument("--window", type=_window, metavar="START:END", help="seconds of the trace")
    p.add_argument("--shard", type=_shard, metavar="I/N", help="this process's share of ids")
    p.add_argument("--model", help="model name for imported traces (default: the target's)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY (captures hold none)")
    p.add_argument("--out", metavar="report.json", help="report JSON (vLLM metric names)")
    p.add_argument("--results", metavar="results.jsonl", help="one capture line per request")
    p.add_argument("--html", metavar="report.html", help="self-contained page with CDF plots")
    p.add_argument("--shadow-target", metavar="URL", help="also send every request here")
    p.add_argument(
        "--shadow-results", metavar="shadow.jsonl", help="--results for the shadow's answers"
    )
    add_sessions_option(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, send nothing")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    return p


def _make_parents(*paths: str | None) -> None:
    """Output folders are created, as a Job writing into a fresh volume expects."""
    for path in paths:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def _convert(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="replay convert", description="Any trace -> capture.jsonl")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True, metavar="CAPTURE")
    p.add_argument("--format", choices=FORMATS)
    p.add_argument("--model", default="default")
    a = p.parse_args(argv)
    fmt: Format | None = a.format
    try:
        src = Source(a.file, fmt, model=a.model)
        synth = PromptSynth()  # the documented rule: prompts match the recorded lengths there
        n = 0
        _make_parents(a.output)
        with open(a.output, "wb") as out:
            for item in src:
                rec = item.record
                if item.synth is not None:
                    body = synth.body(rec.body, item.synth, rec.custom_id, rec.url)
                    rec = dataclasses.replace(rec, body=body)
                out.write(dump_line(rec))
                n += 1
    except (SourceError, OSError) as e:
        print(f"replay convert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {n} requests ({src.format}) to {a.output}; skipped {src.skipped}")
    return 0


def _dry_run(opts: ReplayOptions) -> int:
    src = Source(opts.file, opts.format, model=opts.model or "default")
    stats = dry_run(Plan(src, opts.plan))
    print(f"file        {opts.file} ({src.format})")
    print(f"requests    {stats.requests} (skipped rows: {src.skipped})")
    if opts.concurrency:
        print(f"mode        closed loop, concurrency {opts.concurrency}")
    else:
        print(f"duration    {stats.duration:.3f} s planned")
        print(f"rate        mean {stats.mean_rate:.2f}/s, peak {stats.peak_rate:.0f}/s (1 s bins)")
        print(f"largest gap {stats.largest_gap:.3f} s")
    print(f"out of order rows {stats.out_of_order}; rows without times {stats.untimed}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["convert"]:
        return _convert(args_in[1:])
    if args_in[:1] == ["merge"]:
        return merge_main(args_in[1:])
    if args_in[:1] == ["simulate"]:
        # imported here: the simulator brings the router, policies and engine models along
        from replay.simulate.cli import main as simulate_main

        return simulate_main(args_in[1:])
    parser = _parser()
    a = parser.parse_args(args_in)
    if a.shadow_results and not a.shadow_target:
        parser.error("--shadow-results needs --shadow-target")
    plan = PlanOptions(
        speed=a.speed,
        max_gap=a.max_gap,
        window=a.window,
        max_requests=a.max_requests,
        shard=a.shard,
        rate=a.rate,
    )
    opts = ReplayOptions(
        file=a.file,
        target=a.target,
        policies=tuple(a.policies) if a.policies else (None,),
        format=a.format,
        plan=plan,
        concurrency=a.concurrency,
        shadow_target=a.shadow_target,
        model=a.model,
        results=a.results,
        shadow_results=a.shadow_results,
        api_key=a.api_key,
        progress=sys.stdout.isatty() and not a.no_progress,
        sessions=a.sessions,
    )
    try:
        fmt = a.format or detect_format(a.file)
        if fmt == "openai-batch" and not (a.concurrency or a.rate or a.dry_run):
            print(
                "replay: a Batch file has no arrival times: give --concurrency N or --rate R",
                file=sys.stderr,
            )
            return 2
        if a.dry_run:
            return _dry_run(opts)
        _make_parents(a.out, a.results, a.html)
        replayer = Replayer(opts)
        # Cyclic GC pauses over a long run show up as send lag: park the startup objects
        # out of the collector's reach and collect the young generation less often
        # (per-request objects are freed by reference counting anyway).
        gc.collect()
        gc.freeze()
        gc.set_threshold(100_000, 50, 1000)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runs = runner.run(replayer.run())
    except (SourceError, OSError, ValueError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nreplay: interrupted; no report written", file=sys.stderr)
        return 130
    report = build_report(opts, replayer.format, runs)
    print(render_tables(report))
    if a.out:
        Path(a.out).write_bytes(dumps_report(report))
    if a.html:
        Path(a.html).write_text(render_html(report, collect_samples(runs)), encoding="utf-8")
    return 0

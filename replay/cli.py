"""`replay` (also `turnout replay`): ``replay FILE [options]`` and its subcommands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import sys
from pathlib import Path

import uvloop

from replay.compare import annotate
from replay.merge import main as merge_main
from replay.options import (
    HelpFormatter,
    add_common_options,
    exit_status,
    plan_options,
    positive,
    print_plan,
    write_outputs,
)
from replay.preflight import TargetError
from replay.replayer import Replayer, ReplayOptions, build_report
from replay.sources import FORMATS, Format, Source, SourceError, detect_format
from replay.synth import PromptSynth
from replay.tables import render_tables
from replay.versus import main as compare_main
from turnout.common.capture import dump_line
from turnout.common.pipes import closes_quietly


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def nonnegative(text: str) -> float:
    """A number of seconds, 0 or more."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replay",
        description="Replay a capture or a public trace against an OpenAI-compatible target.",
        epilog=(
            "Also: replay convert FILE -o CAPTURE [--format F] (any trace -> capture.jsonl); "
            "replay merge RESULTS... [--out report.json] [--html report.html] (one report "
            "from shards' results); replay compare A.json B.json [--html C.html] (two "
            "saved reports, paired by request); replay simulate FILE [--config C] [--policy P]... "
            "[--set KEY=V1,V2] (virtual time). Exit status: 0 when the replay ran (failed "
            "requests are summarised), 1 when every request of a run failed, 2 for bad input "
            "or a target that cannot take the replay (checked before the first request)."
        ),
        formatter_class=HelpFormatter,
    )
    mode = add_common_options(p)
    mode.add_argument(
        "--concurrency", type=positive(int), metavar="N", help="closed loop, N in flight"
    )
    p.add_argument(
        "--target",
        type=_url,
        default="http://127.0.0.1:8080",
        metavar="URL",
        help="OpenAI-compatible base URL",
    )
    p.add_argument(
        "--model", metavar="NAME", help="model name for imported traces (default: the target's)"
    )
    p.add_argument(
        "--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY (captures hold none)"
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="run the first policy twice: the comparison's noise floor (an A/A run)",
    )
    p.add_argument(
        "--blocks",
        type=positive(int),
        metavar="K",
        help="with two runs or more: the schedule in K stretches, each replayed by every run "
        "in turn (default: as many as runs)",
    )
    p.add_argument(
        "--warmup",
        type=nonnegative,
        metavar="SECONDS",
        help="with two runs or more: the trace's first SECONDS replayed once per policy, not "
        "measured (default: a tenth of the trace, at most a minute of it; 0: none)",
    )
    p.add_argument("--shadow-target", type=_url, metavar="URL", help="also send every request here")
    p.add_argument(
        "--shadow-results", metavar="shadow.jsonl", help="--results for the shadow's answers"
    )
    return p


def _make_parents(*paths: str | None) -> None:
    """Output folders are created, as a Job writing into a fresh volume expects."""
    for path in paths:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def _convert(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="replay convert",
        description="Any trace -> capture.jsonl",
        formatter_class=HelpFormatter,
    )
    p.add_argument("file", help="capture, Mooncake, Azure, BurstGPT or OpenAI Batch file")
    p.add_argument("-o", "--output", required=True, metavar="CAPTURE", help="capture to write")
    p.add_argument("--format", choices=FORMATS, help="override content detection")
    p.add_argument("--model", default="default", help="model name the requests ask for")
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


@closes_quietly
def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["convert"]:
        return _convert(args_in[1:])
    if args_in[:1] == ["merge"]:
        return merge_main(args_in[1:])
    if args_in[:1] == ["compare"]:
        return compare_main(args_in[1:])
    if args_in[:1] == ["simulate"]:
        # imported here: the simulator brings the router, policies and engine models along
        from replay.simulate.cli import main as simulate_main

        return simulate_main(args_in[1:])
    parser = _parser()
    a = parser.parse_args(args_in)
    if a.shadow_results and not a.shadow_target:
        parser.error("--shadow-results needs --shadow-target")
    opts = ReplayOptions(
        file=a.file,
        target=a.target,
        policies=tuple(a.policies) if a.policies else (None,),
        format=a.format,
        plan=plan_options(a),
        concurrency=a.concurrency,
        shadow_target=a.shadow_target,
        model=a.model,
        results=a.results,
        shadow_results=a.shadow_results,
        api_key=a.api_key,
        progress=sys.stdout.isatty() and not a.no_progress,
        sessions=a.sessions,
        aa=a.aa,
        blocks=a.blocks,
        warmup_s=a.warmup,
        window_s=a.window_seconds,
        prices=dict(a.prices),
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
            print_plan(a, a.model or "default", a.concurrency)
            return 0
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
    except BrokenPipeError:
        raise  # stdout's reader went away: not bad input (see closes_quietly)
    except (SourceError, OSError, ValueError, TargetError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nreplay: interrupted; no report written", file=sys.stderr)
        return 130
    report = annotate(build_report(replayer, runs), replayer.pricing)
    print(render_tables(report))
    write_outputs(report, a.out, a.html)
    return exit_status("replay", report)

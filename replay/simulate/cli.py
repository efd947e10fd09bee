"""``replay simulate FILE --config router.yaml --policy A --policy B [--set KEY=V1,V2]...``.

Reads what ``replay`` reads, with the same options (:mod:`replay.options`), and writes the
same outputs (terminal tables, ``--out`` report JSON, ``--results`` lines, ``--html``), marked
as simulated. Each policy runs once per grid point of the ``--set`` options, each run on fresh
engines. ``--time-shard I/N`` simulates the I-th of N equal time windows of the schedule
(times stay on the whole schedule's base, so ``replay merge`` joins the pieces' results).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from replay.client import Result
from replay.compare import annotate
from replay.options import (
    HelpFormatter,
    add_common_options,
    exit_status,
    plan_options,
    print_plan,
    shard,
    write_outputs,
)
from replay.plan import Plan, Planned, dry_run
from replay.preflight import unknown_policies
from replay.replayer import result_line
from replay.report import RunReport
from replay.simulate.compared import run_compared
from replay.simulate.loop import OnResult, Simulation
from replay.simulate.pareto import pareto_points, render_pareto
from replay.simulate.sweep import Setting, apply, grid, label, parse_set
from replay.simulate.world import World
from replay.sources import Item, Source, SourceError, detect_format
from replay.tables import render_tables
from replay.timeline import Frame, window_seconds
from router.cli import default_config_path
from router.config.model import ConfigError, RouterConfig
from router.config.parse import load_document, parse_config
from router.control.slo import slo_table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replay simulate",
        description="Replay a trace through the router's policies and engine models in "
        "virtual time (no sockets, no sleeping); the same report as replay, marked simulated.",
        epilog="Exit status as replay's: 1 when every request of a run failed, 2 for bad input.",
        formatter_class=HelpFormatter,
    )
    add_common_options(p)
    p.add_argument("--config", help="router config (default: the embedded default)")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="BACKEND=PROFILE",
        help="engine profile for a backend without an emulator (or to replace its own)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="KEY=V1,V2",
        help="sweep a config key path over values (several: the grid)",
    )
    p.add_argument(
        "--time-shard",
        type=shard,
        metavar="I/N",
        help="only the I-th of N equal time windows of the schedule (N processes, one "
        "simulation; replay merge joins their results)",
    )
    return p


def _profiles(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        backend, sep, profile = pair.partition("=")
        if not sep or not backend or not profile:
            raise ValueError(f"--profile expects BACKEND=PROFILE (got {pair!r})")
        out[backend] = profile
    return out


def _window_of(items: Iterator[Planned], lo: float, hi: float | None) -> Iterator[Planned]:
    for p in items:
        if p.at >= lo and (hi is None or p.at < hi):
            yield p


def _meta(
    sim: Simulation, setting: Setting, virtual: float, cpu: float, wall: float
) -> dict[str, Any]:
    """A run's ``simulation`` entry: its cost, and what the tail defences did (if any)."""
    out: dict[str, Any] = {
        "setting": {k: v for k, v in setting},
        "virtual_seconds": round(virtual, 3),
        "cpu_seconds": round(cpu, 3),
        "wall_seconds": round(wall, 3),
        "events": sim.events,
    }
    if sim.world.config.tail:
        out["tail"] = dataclasses.asdict(sim.tails.counts)
    return out


class Simulator:
    """Every (setting, policy) run over one file; collects reports and writes results."""

    def __init__(self, a: argparse.Namespace, doc: object, config: RouterConfig) -> None:
        self.a = a
        self.doc = doc
        self.base = config
        self.profiles = _profiles(a.profile)
        self.plan = plan_options(a)
        self.format: str | None = a.format
        self.runs: list[RunReport] = []
        self.meta: list[dict[str, Any]] = []
        self.lo, self.hi = 0.0, None
        self.skipped: list[str] = []
        self.frame: Frame | None = None
        self.pricing = {**config.pricing, **dict(a.prices)}

    def _source(self, model: str) -> Source:
        src = Source(self.a.file, self.a.format, model=model, sessions=self.a.sessions)
        self.format = src.format
        return src

    def shard_bounds(self, model: str) -> None:
        """The time shard's window over the schedule's whole span."""
        if self.a.time_shard is None:
            return
        i, n = self.a.time_shard
        span = dry_run(Plan(self._source(model), self.plan)).duration
        width = span / n
        self.lo = i * width
        self.hi = None if i == n - 1 else (i + 1) * width

    def print_plan(self) -> None:
        """``--dry-run``: replay's plan printout, and the time shard's window."""
        model = World(self.base, self.profiles).model()
        print_plan(self.a, model)
        if self.a.time_shard is not None:
            self.shard_bounds(model)
            i, n = self.a.time_shard
            end = "its end" if self.hi is None else f"{self.hi:.3f} s"
            print(f"time shard  {i}/{n}: from {self.lo:.3f} s to {end} of the schedule")

    def run_all(self, results: IO[bytes] | None) -> None:
        sweeps = [parse_set(s) for s in self.a.sets]
        for setting in grid(sweeps):
            config = parse_config(apply(self.doc, setting)) if setting else self.base
            policies = self.a.policies or [config.default_policy]
            if len(policies) > 1 and self.a.time_shard is None:
                self.run_compared(config, policies, setting, results)
                continue
            for policy in policies:
                self.run_one(config, policy, setting, results)

    def run_compared(
        self,
        config: RouterConfig,
        policies: list[str],
        setting: Setting,
        results: IO[bytes] | None,
    ) -> None:
        """Every policy at one grid point on one deployment, in the live comparison's order
        (:mod:`replay.simulate.compared`)."""
        world = World(config, self.profiles)
        model = world.model()
        reports = [RunReport(label(p, setting), frame=self._frame(world)) for p in policies]
        wall = time.perf_counter()

        def reporter(report: RunReport) -> OnResult:
            def on_result(item: Item, r: Result, sent: float) -> None:
                report.add(r, sent=sent)
                if results is not None:
                    results.write(result_line(item, r, sent))

            return on_result

        sources: list[Source] = []

        def schedule() -> Iterator[Planned]:
            sources.append(self._source(model))
            return iter(Plan(sources[-1], self.plan))

        runs = [(p, r.policy or p) for p, r in zip(policies, reports, strict=True)]
        span = dry_run(Plan(self._source(model), self.plan)).duration
        done = run_compared(world, runs, schedule, span, [reporter(r) for r in reports])
        if not self.runs and sources:
            self._skipped(sources[-1])
        for report, (sim, virtual, cpu) in zip(reports, done, strict=True):
            self.runs.append(report)
            self.meta.append(_meta(sim, setting, virtual, cpu, time.perf_counter() - wall))

    def run_one(
        self, config: RouterConfig, policy: str, setting: Setting, results: IO[bytes] | None
    ) -> None:
        world = World(config, self.profiles)
        if self.a.time_shard is not None and not self.runs:
            self.shard_bounds(world.model())
        name = label(policy, setting)
        report = RunReport(name, frame=self._frame(world))
        lo = self.lo

        def on_result(item: Item, r: Result, sent: float) -> None:
            report.add(r, sent=sent - lo)
            if results is not None:
                results.write(result_line(item, r, sent))

        source = self._source(world.model())
        plan = _window_of(iter(Plan(source, self.plan)), self.lo, self.hi)
        # salted as the live replayer salts the run with this index (see replay.synth)
        sim = Simulation(world, world.policies[policy], name, on_result, salt=len(self.runs))
        cpu, wall = time.process_time(), time.perf_counter()
        end = sim.run(plan, start=self.lo)
        self.runs.append(report)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        self.meta.append(_meta(sim, setting, end - self.lo, cpu, wall))
        if len(self.runs) == 1:
            self._skipped(source)

    def _skipped(self, source: Source) -> None:
        """What the first run's source skipped, to say once."""
        self.skipped = source.errors + (
            [f"{source.skipped} rows in all"] if source.skipped > len(source.errors) else []
        )

    def _frame(self, world: World) -> Frame:
        """The first run's windows and SLOs, for every run: one yardstick for all."""
        if self.frame is None:
            span = self.hi - self.lo if self.hi is not None else None
            if span is None:
                span = dry_run(Plan(self._source(world.model()), self.plan)).duration - self.lo
            table = slo_table(world.policies, world.config.default_policy)
            slo = table.get(world.config.default_policy) or {}
            self.frame = Frame(
                window_seconds(span * self.a.speed, self.a.window_seconds),
                self.a.speed,
                {c: (t.ttft_s, t.tpot_s) for c, t in slo.items()},
            )
        return self.frame

    def report(self) -> dict[str, Any]:
        a = self.a
        runs = []
        for run, meta in zip(self.runs, self.meta, strict=True):
            runs.append({**run.to_dict(), "simulation": meta})
        out: dict[str, Any] = {
            "file": a.file,
            "format": self.format,
            "target": f"simulated, {a.config or 'embedded default'}",
            "mode": "timed",
            "speed": a.speed,
            "concurrency": None,
            "simulated": True,
            "config": a.config,
            "shard": list(a.shard) if a.shard else None,
            "time_shard": list(a.time_shard) if a.time_shard else None,
            "window_s": [self.lo, self.hi] if a.time_shard else None,
            "sweep": [parse_set(s).key for s in a.sets],
            "runs": runs,
        }
        if a.sets:
            out["pareto"] = pareto_points(runs)
        slo = self.frame.slo if self.frame else {}
        out["slo"] = {c: {"ttft_s": t, "tpot_s": p} for c, (t, p) in sorted(slo.items())}
        # a sweep's answer is its Pareto chart: every run against the first is not asked
        return annotate(out, self.pricing, compare=not a.sets)


def main(argv: list[str]) -> int:
    """Entry point of ``replay simulate``."""
    a = _parser().parse_args(argv)
    try:
        path = a.config or str(default_config_path())
        doc = load_document(path)
        sim = Simulator(a, doc, parse_config(doc))
        why = unknown_policies(a.policies or [], [p.name for p in sim.base.policies])
        if why is not None:
            raise ValueError(why)
        if a.dry_run:
            sim.print_plan()
            return 0
        if (a.format or detect_format(a.file)) == "openai-batch" and not a.rate:
            raise ValueError("a Batch file has no arrival times: give --rate R")
        for p in (a.out, a.results, a.html):
            if p:
                Path(p).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as files:
            results = files.enter_context(open(a.results, "wb")) if a.results else None
            sim.run_all(results)
    except ConfigError as e:
        print(f"replay simulate: {a.config or 'config'}:\n{e}", file=sys.stderr)
        return 2
    except (SourceError, OSError, ValueError) as e:
        print(f"replay simulate: {e}", file=sys.stderr)
        return 2
    for err in sim.skipped:
        print(f"replay simulate: skipped {err}", file=sys.stderr)
    report = sim.report()
    print(render_tables(report))
    for run in report["runs"]:
        m = run["simulation"]
        speedup = m["virtual_seconds"] / max(m["cpu_seconds"], 1e-9)
        print(
            f"simulated {run['policy']}: {m['virtual_seconds']:.1f} s of traffic in "
            f"{m['cpu_seconds']:.2f} s CPU ({speedup:,.0f}x real time, {m['events']} events)"
        )
        if "tail" in m:
            t = m["tail"]
            print(
                f"  tail: {t['hedges']} hedges ({t['hedges_won']} won, {t['cancelled']} "
                f"attempts cancelled, {t['wasted_tokens']} tokens wasted), {t['missed']} "
                f"missed first-token deadlines, {t['extra']} extra requests"
            )
    write_outputs(report, a.out, a.html, extra=render_pareto(report))
    return exit_status("replay simulate", report)

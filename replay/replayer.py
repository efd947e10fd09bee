"""One replay session: the file run once per policy against a target, results and report.

Wires the pieces: :class:`~replay.sources.Source` -> :class:`~replay.plan.Plan` ->
:class:`~replay.runner.Runner` -> :class:`~replay.client.TargetClient` -> ``RunReport`` (and the
``--results`` file), after :func:`~replay.preflight.check_target` found the target ready.
Two runs or more replay the schedule in interleaved stretches after a warm-up
(:mod:`replay.order`). The progress line and the prompt synthesizer's calibration live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import aiohttp
import orjson

from replay.client import Result, TargetClient, encode_body
from replay.compare import AA_SUFFIX
from replay.order import (
    WARMUP,
    Stretch,
    default_warmup,
    describe,
    prefix_caches,
    stretches,
    within,
)
from replay.plan import Plan, Planned, PlanOptions, dry_run
from replay.preflight import check_target, target_terms
from replay.progress import Progress
from replay.report import RunReport
from replay.runner import Runner
from replay.sessions import Conversations
from replay.sources import Format, Item, SessionMode, Source
from replay.synth import Calibration, PromptSynth, calibrate, salted
from replay.timeline import Frame, window_seconds
from turnout.common.capture import CaptureRecord, Observed, Response, Route, dump_line, iso_utc

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """Everything one ``replay FILE`` invocation asked for."""

    file: str
    target: str = "http://127.0.0.1:8080"
    policies: tuple[str | None, ...] = (None,)
    format: Format | None = None
    plan: PlanOptions = field(default_factory=PlanOptions)
    concurrency: int | None = None
    shadow_target: str | None = None
    model: str | None = None
    results: str | None = None
    shadow_results: str | None = None
    """Where the shadow target's answers go, one line per request as in ``results``."""
    progress: bool = False
    sessions: SessionMode = "auto"
    api_key: str | None = field(default=None, repr=False)
    aa: bool = False
    """Run the first policy once more, for the comparison's noise floor."""
    blocks: int | None = None
    """Stretches the schedule is cut into for two runs or more (None: as many as runs)."""
    warmup_s: float | None = None
    """Seconds of the trace replayed once per policy first, not measured (None: a tenth)."""
    window_s: float | None = None
    """The timeline's windows, seconds of the trace (None: fitted to the trace's length)."""
    prices: Mapping[str, float] = field(default_factory=dict)
    """Backend -> USD an hour (``--price``), over what the target's config says."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def target_calibration(session: aiohttp.ClientSession, target: str) -> Calibration:
    """Fit synthesis to the target's ``/tokenize``; the documented rule if it has none.

    vLLM's (and the emulator's) ``/tokenize`` counts chat ``messages``; llama.cpp's takes only
    text (``content``) and answers a ``tokens`` list, so there the chat template is rendered
    by its ``/apply-template`` first.
    """
    base = target.rstrip("/")

    async def post(path: str, body: dict[str, Any]) -> Any:
        async with session.post(base + path, json=body) as r:
            if r.status != 200:
                raise ValueError(f"{path} answered {r.status}")
            return await r.json()

    async def count(messages: list[dict[str, Any]]) -> int:
        doc = await post("/tokenize", {"messages": messages})
        if "count" in doc:
            return int(doc["count"])
        prompt = (await post("/apply-template", {"messages": messages}))["prompt"]
        return len((await post("/tokenize", {"content": prompt, "add_special": True}))["tokens"])

    try:
        return await calibrate(count)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return Calibration()


def result_line(item: Item, r: Result, sent_at: float | None) -> bytes:
    rec = item.record
    return dump_line(
        CaptureRecord(
            custom_id=rec.custom_id,
            url=rec.url,
            body=rec.body,
            t_offset_ms=None if sent_at is None else sent_at * 1000.0,
            ts=iso_utc(time.time()),
            headers=rec.headers,
            route=Route(r.policy, r.request_class, r.backend, max((r.attempts or 1) - 1, 0)),
            resp=Response(
                r.status,
                r.stream,
                r.finish_reason,
                r.prompt_tokens,
                r.completion_tokens,
                r.error,
                r.cached_tokens,
            ),
            obs=Observed(
                None if r.ttft is None else r.ttft * 1000.0,
                None if r.tpot is None else r.tpot * 1000.0,
                None if r.e2e is None else r.e2e * 1000.0,
                None if r.lag is None else r.lag * 1000.0,
                tuple(x * 1000.0 for x in r.itls) if r.stream else None,
            ),
        )
    )


@dataclass(slots=True)
class _Run:
    """One run's state, kept across its stretches of the schedule."""

    label: str | None
    policy: str | None
    report: RunReport
    synth: PromptSynth
    conversations: Conversations


class Replayer:
    """Runs the file once per policy (and once more for ``--aa``); :meth:`run` returns one
    ``RunReport`` per run, in the order of :attr:`labels`."""

    def __init__(self, opts: ReplayOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self.clock = clock
        self.format: Format | None = opts.format
        policies = list(opts.policies)
        self.labels: list[str | None] = list(policies)
        if opts.aa:
            policies.append(policies[0])
            self.labels.append((policies[0] or "target") + AA_SUFFIX)
        self._policies = policies
        self.order: list[Stretch] = []
        self.frame = Frame()
        self.span = 0.0
        self.lead = 0.0
        """Seconds of the schedule replayed, not measured, before each block after the first."""
        self.prompts = {"synthesized": 0, "marked": 0, "as_recorded": 0}
        """How the first run's prompts were sent (see :func:`prefix_caches`)."""
        self._first: RunReport | None = None
        self.slo: dict[str, tuple[float, float]] = {}
        """Each class's SLO (TTFT s, TPOT s), as the target judges goodput."""
        self.pricing: dict[str, float] = {}
        """Backend -> USD an hour: the target's, and ``--price``."""

    def _source(self, model: str) -> Source:
        src = Source(self.opts.file, self.opts.format, model=model, sessions=self.opts.sessions)
        self.format = src.format
        return src

    def _plan(self, span: float) -> None:
        """The order of the runs' stretches (see :mod:`replay.order`) and the frame they are
        measured in, for a schedule ``span`` long (seconds, or requests in closed loop)."""
        o = self.opts
        speed = 1.0 if o.concurrency else o.plan.speed
        runs = len(self._policies)
        if runs == 1:
            self.order = [Stretch(0, 0, 0.0, math.inf)]
        else:
            blocks = o.blocks or runs
            warm = default_warmup(span) if o.warmup_s is None else o.warmup_s / speed
            first = {p: i for i, p in reversed(list(enumerate(self._policies)))}
            self.order = stretches(runs, blocks, span, warmup_s=warm, warm=sorted(first.values()))
            self.lead = warm
        # a closed loop plans no times: its windows are as asked, else 10 s of the replay
        window = (o.window_s or 10.0) if o.concurrency else window_seconds(span * speed, o.window_s)
        self.frame = Frame(window, speed, self.slo)

    async def run(self) -> list[RunReport]:
        """Every run's stretches in :attr:`order`, over the same traffic."""
        o = self.opts
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        auth = {"authorization": f"Bearer {o.api_key}"} if o.api_key else None
        async with aiohttp.ClientSession(
            connector=connector, timeout=_TIMEOUT, auto_decompress=False, headers=auth
        ) as session:
            named = [p for p in o.policies if p is not None]
            keyed = auth is not None
            models = await check_target(session, o.target, named, keyed=keyed)
            if o.shadow_target:
                await check_target(session, o.shadow_target, named, keyed=keyed, router=False)
            # imported traces ask for the target's first listed model
            model = o.model or (models[0] if models else "default")
            terms = await target_terms(session, o.target, keyed=keyed)
            if terms.note and not o.prices:
                _stderr(f"replay: {terms.note}")
            self.slo = terms.slo
            self.pricing = {**terms.pricing, **o.prices}
            calibration = await target_calibration(session, o.target)
            stats = dry_run(Plan(self._source(model), o.plan))
            self.span = float(stats.requests) if o.concurrency else stats.duration
            self._plan(self.span)
            runs = [
                self._run_state(label, policy, PromptSynth(calibration, salt=n), n)
                for n, (label, policy) in enumerate(zip(self.labels, self._policies, strict=True))
            ]
            self._first = runs[0].report
            with contextlib.ExitStack() as files:
                results = files.enter_context(open(o.results, "wb")) if o.results else None
                shadow_results = (
                    files.enter_context(open(o.shadow_results, "wb"))
                    if o.shadow_results and o.shadow_target
                    else None
                )
                for k, stretch in enumerate(self.order):
                    run = runs[stretch.run]
                    sinks = results, shadow_results
                    if stretch.block == WARMUP:  # its own salt and sessions, not reported
                        synth = PromptSynth(calibration, salt=len(runs) + stretch.run)
                        name = f"{run.label or 'target'} warm-up"
                        run = self._run_state(name, run.policy, synth, -1)
                        sinks = None, None
                    await self._stretch(session, model, run, stretch, *sinks, first=k == 0)
            return [run.report for run in runs]

    def _run_state(self, label: str | None, policy: str | None, synth: PromptSynth, n: int) -> _Run:
        aa = self.opts.aa and n == len(self._policies) - 1
        report = RunReport(label, shadow_target=self.opts.shadow_target, frame=self.frame, aa=aa)
        return _Run(label, policy, report, synth, Conversations(synth))

    async def _stretch(
        self,
        session: aiohttp.ClientSession,
        model: str,
        run: _Run,
        stretch: Stretch,
        results: IO[bytes] | None,
        shadow_results: IO[bytes] | None,
        *,
        first: bool,
    ) -> None:
        """Replay ``stretch`` of the schedule as ``run``, from an idle target to its last
        answer."""
        o = self.opts
        synth, report, conversations = run.synth, run.report, run.conversations
        client = TargetClient(session, o.target, policy=run.policy, clock=self.clock)
        shadow = (
            TargetClient(session, o.shadow_target, policy=run.policy, clock=self.clock)
            if o.shadow_target
            else None
        )
        # on the whole schedule's clock: the stretch starts where it is in the schedule
        # After the first block, the stretch begins ``lead`` seconds early, not measured: the
        # engines start the block as loaded as one run would have them (see replay.order).
        lead = self.lead if stretch.block > 0 and not o.concurrency else 0.0
        base = 0.0 if o.concurrency else stretch.lo - lead
        leading: set[int] = set()  # the rows sent as the lead-in
        runner: Runner

        salt = len(self._policies) > 1  # runs would share recorded prompts' text
        counts = self.prompts if run.report is self._first else None

        def prepare(item: Item) -> bytes:
            rec = item.record
            body: Mapping[str, Any] = rec.body
            how = "as_recorded"
            if item.synth is not None:
                body, how = synth.body(rec.body, item.synth, rec.custom_id, rec.url), "synthesized"
            elif salt and item.session is None:  # a turn's history must match the last turn's
                marked = salted(rec.body, synth.salt)
                if marked is not None:
                    body, how = marked, "marked"
            if counts is not None and item.row not in leading:
                counts[how] += 1
            return encode_body(body, rec.url)

        async def send(item: Item, body: bytes, lag: float | None) -> None:
            r = None
            turn = None
            try:
                before = self.clock()
                body, turn = await conversations.begin(item, body)
                if self.clock() - before > 1e-3:
                    lag = None  # it waited for the previous turn's answer: not a late send
                r = await send_now(item, body, lag)
            finally:
                conversations.end(item, turn, body, r)

        async def send_now(item: Item, body: bytes, lag: float | None) -> Result:
            rec = item.record
            sent_at = self.clock() - runner.start + base
            keep = item.session is not None  # the answer goes into the next turn's prompt
            if item.row in leading:
                return await client.send(rec, body, lag)
            if shadow is None:
                r = await client.send(rec, body, lag, keep_text=keep)
            else:
                det = rec.body.get("temperature") == 0
                r, s = await asyncio.gather(
                    client.send(rec, body, lag, keep_text=det or keep),
                    shadow.send(rec, body, lag, keep_text=det),
                )
                if report.aa:
                    s.policy = run.label
                report.add_shadow(r, s, deterministic=det, sent=sent_at)
                if shadow_results is not None:
                    shadow_results.write(result_line(item, s, sent_at))
            if report.aa:  # in the results, the A/A run's requests are told apart by its name
                r.policy = run.label
            report.add(r, sent=sent_at)
            if results is not None:
                results.write(result_line(item, r, sent_at))
            return r

        runner = Runner(prepare, send, clock=self.clock)
        source = self._source(model)
        plan = Plan(source, o.plan)

        def stretched() -> Iterator[Planned]:
            for p in within(plan, stretch.lo - lead, stretch.hi, by_index=bool(o.concurrency)):
                if p.at < lead:
                    if p.item.session is not None:  # its turn is the previous block's
                        continue
                    leading.add(p.item.row)
                yield p

        progress_task = None
        if o.progress:
            length = min(stretch.hi, self.span) - stretch.lo + lead
            planned = f"{length:.0f} requests" if o.concurrency else f"{length:.1f}s"
            where = "" if len(self.order) == 1 else self._where(stretch)
            prog = Progress(runner, report, planned, (run.label or "target") + where)
            progress_task = asyncio.create_task(prog.run(sys.stdout, self.clock))
        try:
            # The report's durations come from each answer's end (see RunReport), not from
            # the runner's timing, which also waits for the shadow's answers.
            if o.concurrency:
                await runner.closed_loop(stretched(), o.concurrency)
            else:
                await runner.open_loop(stretched())
        finally:
            if progress_task is not None:
                progress_task.cancel()
                await asyncio.gather(progress_task, return_exceptions=True)
        if first:  # the file is the same for every stretch: tell once
            for err in source.errors:
                _stderr(f"replay: skipped {err}")
            if source.skipped > len(source.errors):
                _stderr(f"replay: skipped {source.skipped} rows in all")
            if plan.out_of_order:
                _stderr(f"replay: {plan.out_of_order} rows were out of order in the file")

    def _where(self, stretch: Stretch) -> str:
        if stretch.block == WARMUP:
            return ""
        blocks = max(s.block for s in self.order) + 1
        return f", block {stretch.block + 1}/{blocks}"


def build_report(replayer: Replayer, runs: list[RunReport]) -> dict[str, Any]:
    """``report.json`` (see docs/replay.md), before :func:`replay.compare.annotate`."""
    o = replayer.opts
    return {
        "file": o.file,
        "format": replayer.format,
        "target": o.target,
        "mode": "closed" if o.concurrency else "timed",
        "speed": o.plan.speed,
        "concurrency": o.concurrency,
        "window": list(o.plan.window) if o.plan.window else None,
        "slo": {c: {"ttft_s": t, "tpot_s": p} for c, (t, p) in sorted(replayer.slo.items())},
        "order": describe([r.policy or "target" for r in runs], replayer.order, o.plan.speed),
        "prefix_caches": prefix_caches(replayer.prompts, len(runs)),
        "runs": [r.to_dict() for r in runs],
    }


def dumps_report(report: dict[str, Any]) -> bytes:
    """Indented JSON, newline-terminated."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

"""One replay session: the file run once per policy against a target, results and report.

Wires the pieces: :class:`~replay.sources.Source` -> :class:`~replay.plan.Plan` ->
:class:`~replay.runner.Runner` -> :class:`~replay.client.Client` -> ``RunReport`` (and the
``--results`` file), after :func:`~replay.preflight.check_target` found the target ready.
The progress line and the prompt synthesizer's calibration live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import aiohttp
import orjson

from replay.client import Client, Result, encode_body
from replay.plan import Plan, PlanOptions, dry_run
from replay.preflight import check_target
from replay.report import RunReport
from replay.runner import Runner
from replay.sessions import Conversations
from replay.sources import Format, Item, SessionMode, Source
from replay.synth import Calibration, PromptSynth, calibrate
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


def _end(sent_at: float, r: Result) -> float:
    """When ``r`` ended, in seconds from the run's start (as its results line tells it)."""
    return sent_at + (r.e2e or 0.0)


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
            route=Route(r.policy, r.request_class, r.backend, 0),
            resp=Response(
                r.status, r.stream, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.error
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


class Progress:
    """``sent / done / failed, elapsed / planned`` on one rewritten terminal line.

    ``planned`` is the schedule's length in seconds (open loop) or its request count (closed
    loop, where time is not planned).
    """

    def __init__(self, runner: Runner, report: RunReport, planned: str, label: str) -> None:
        self._runner = runner
        self._report = report
        self._planned = planned
        self._label = label

    def line(self, now: float) -> str:
        """The current progress text."""
        r = self._runner
        failed = self._report.overall.failed
        return (
            f"[{self._label}] sent {r.sent}  done {r.done}  failed {failed}  "
            f"elapsed {now - r.start:6.1f}s / planned {self._planned}"
        )

    async def run(self, out: IO[str], clock: Callable[[], float]) -> None:
        """Redraw every half second until cancelled."""
        try:
            while True:
                out.write("\r" + self.line(clock()))
                out.flush()
                await asyncio.sleep(0.5)
        finally:
            out.write("\r" + self.line(clock()) + "\n")
            out.flush()


class Replayer:
    """Runs the file once per policy; :meth:`run` returns one ``RunReport`` per policy."""

    def __init__(self, opts: ReplayOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self.clock = clock
        self.format: Format | None = opts.format

    def _source(self, model: str) -> Source:
        src = Source(self.opts.file, self.opts.format, model=model, sessions=self.opts.sessions)
        self.format = src.format
        return src

    async def run(self) -> list[RunReport]:
        """Every policy's run, one after another, over the same traffic."""
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
            calibration = await target_calibration(session, o.target)
            with contextlib.ExitStack() as files:
                results = files.enter_context(open(o.results, "wb")) if o.results else None
                shadow_results = (
                    files.enter_context(open(o.shadow_results, "wb"))
                    if o.shadow_results and o.shadow_target
                    else None
                )
                return [
                    await self._run_one(
                        session, model, calibration, n, policy, results, shadow_results
                    )
                    for n, policy in enumerate(o.policies)
                ]

    async def _run_one(
        self,
        session: aiohttp.ClientSession,
        model: str,
        calibration: Calibration,
        index: int,
        policy: str | None,
        results: IO[bytes] | None,
        shadow_results: IO[bytes] | None,
    ) -> RunReport:
        o = self.opts
        # one salt per run: no run finds the previous run's prompts in a prefix cache
        synth = PromptSynth(calibration, salt=index)
        report = RunReport(policy, shadow_target=o.shadow_target)
        client = Client(session, o.target, policy=policy, clock=self.clock)
        shadow = (
            Client(session, o.shadow_target, policy=policy, clock=self.clock)
            if o.shadow_target
            else None
        )
        source = self._source(model)
        conversations = Conversations(synth)
        runner: Runner

        def prepare(item: Item) -> bytes:
            rec = item.record
            body = (
                rec.body
                if item.synth is None
                else synth.body(rec.body, item.synth, rec.custom_id, rec.url)
            )
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
            sent_at = self.clock() - runner.start
            keep = item.session is not None  # the answer goes into the next turn's prompt
            if shadow is None:
                r = await client.send(rec, body, lag, keep_text=keep)
            else:
                det = rec.body.get("temperature") == 0
                r, s = await asyncio.gather(
                    client.send(rec, body, lag, keep_text=det or keep),
                    shadow.send(rec, body, lag, keep_text=det),
                )
                report.add_shadow(r, s, deterministic=det, end=_end(sent_at, s))
                if shadow_results is not None:
                    shadow_results.write(result_line(item, s, sent_at))
            report.add(r, end=_end(sent_at, r))
            if results is not None:
                results.write(result_line(item, r, sent_at))
            return r

        runner = Runner(prepare, send, clock=self.clock)
        progress_task = None
        if o.progress:
            stats = dry_run(Plan(self._source(model), o.plan))
            planned = f"{stats.requests} requests" if o.concurrency else f"{stats.duration:.1f}s"
            prog = Progress(runner, report, planned, policy or "target")
            progress_task = asyncio.create_task(prog.run(sys.stdout, self.clock))
        plan = Plan(source, o.plan)
        try:
            # The report's durations come from each answer's end (see RunReport), not from
            # the runner's timing, which also waits for the shadow's answers.
            if o.concurrency:
                await runner.closed_loop(plan, o.concurrency)
            else:
                await runner.open_loop(plan)
        finally:
            if progress_task is not None:
                progress_task.cancel()
                await asyncio.gather(progress_task, return_exceptions=True)
        if index == 0:  # the file is the same for every run: tell once
            for err in source.errors:
                _stderr(f"replay: skipped {err}")
            if source.skipped > len(source.errors):
                _stderr(f"replay: skipped {source.skipped} rows in all")
            if plan.out_of_order:
                _stderr(f"replay: {plan.out_of_order} rows were out of order in the file")
        return report


def build_report(opts: ReplayOptions, fmt: str | None, runs: list[RunReport]) -> dict[str, Any]:
    """``report.json`` as INTERFACES.md describes it."""
    return {
        "file": opts.file,
        "format": fmt,
        "target": opts.target,
        "mode": "closed" if opts.concurrency else "timed",
        "speed": opts.plan.speed,
        "concurrency": opts.concurrency,
        "runs": [r.to_dict() for r in runs],
    }


def dumps_report(report: dict[str, Any]) -> bytes:
    """Indented JSON, newline-terminated."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

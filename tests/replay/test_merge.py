"""``replay merge`` over one replay's own results gives that replay's report back.

In-process: two loopback aiohttp servers stand in for the target and a slower shadow target,
the real :class:`~replay.replayer.Replayer` runs two policies against them, and the merge of
its ``--results`` / ``--shadow-results`` files is compared with the report it printed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from replay.merge import main as merge_main
from replay.merge import merge_runs, merged_report
from replay.replayer import Replayer, ReplayOptions, build_report
from replay.tables import render_tables
from tests.replay.served import served
from turnout.common.capture import CaptureRecord, dump_line

SHADOW_DELAY = 0.15  # the shadow answers this much later than the target
REQUESTS = 6
COUNTS = ("completed", "failed", "total_input_tokens", "total_output_tokens")
LATENCIES = ("mean_ttft_ms", "mean_e2el_ms", "p99_e2el_ms")
RATES = ("request_throughput", "output_throughput", "total_token_throughput")


async def _engine(delay: float) -> AsyncIterator[str]:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay)
        return web.json_response({
            "id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "two words"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2},
        })  # fmt: skip

    async def policies(_: web.Request) -> web.Response:
        return web.json_response([{"name": "round-robin"}, {"name": "adaptive"}])

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/turnout/policies", policies)  # a router's list: --policy is checked
    async with served(app) as url:
        yield url


@pytest.fixture
async def target() -> AsyncIterator[str]:
    async for url in _engine(0.0):
        yield url


@pytest.fixture
async def shadow() -> AsyncIterator[str]:
    async for url in _engine(SHADOW_DELAY):
        yield url


def _capture(path: Path) -> None:
    with path.open("wb") as f:
        for i in range(REQUESTS):
            body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
            rec = CaptureRecord(f"q{i}", "/v1/chat/completions", body, t_offset_ms=10.0 * i)
            f.write(dump_line(rec))


def _merged(paths: list[str]) -> dict[str, Any]:
    return merged_report(paths, merge_runs(paths), {})


def _same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    for key in COUNTS:
        assert got[key] == want[key], (what, key)
    # the results lines keep times to the microsecond
    for key in LATENCIES:
        assert got[key] == pytest.approx(want[key], abs=1e-3), (what, key)
    assert got["duration"] == pytest.approx(want["duration"], abs=3e-6), what
    for key in RATES:
        assert got[key] == pytest.approx(want[key], rel=1e-3), (what, key)


async def test_merge_of_a_runs_results_is_its_report(
    target: str, shadow: str, tmp_path: Path
) -> None:
    capture = tmp_path / "capture.jsonl"
    _capture(capture)
    results, shadow_results = tmp_path / "results.jsonl", tmp_path / "shadow.jsonl"
    opts = ReplayOptions(
        file=str(capture),
        target=target,
        shadow_target=shadow,
        policies=("round-robin", "adaptive"),  # not in name order
        model="m",
        results=str(results),
        shadow_results=str(shadow_results),
    )
    replayer = Replayer(opts)
    report = build_report(replayer, await replayer.run())
    merged = _merged([str(results)])
    merged_shadow = _merged([str(shadow_results)])

    # the runs in the order they ran, as the report has them
    assert [r["policy"] for r in merged["runs"]] == ["round-robin", "adaptive"]
    assert [r["policy"] for r in merged_shadow["runs"]] == ["round-robin", "adaptive"]
    for run, again, shadow_again in zip(
        report["runs"], merged["runs"], merged_shadow["runs"], strict=True
    ):
        m = run["overall"]
        assert m["completed"] == REQUESTS and m["failed"] == 0
        # A slower shadow does not stretch the target's run: each target's duration ends
        # at its own last answer, so its throughput is what the merge recomputes.
        _same(again["overall"], m, run["policy"])
        _same(shadow_again["overall"], run["shadow"]["overall"], f"{run['policy']} shadow")
        # (strictly shorter, not shorter by the whole delay: on a loaded machine the event
        # loop's own lag stretches both runs, and the shadow's sleep overlaps it)
        assert m["duration"] < run["shadow"]["overall"]["duration"]


async def test_merge_html_is_the_replays_page_of_the_merged_report(
    target: str, tmp_path: Path
) -> None:
    capture, results = tmp_path / "capture.jsonl", tmp_path / "results.jsonl"
    _capture(capture)
    opts = ReplayOptions(
        file=str(capture), target=target, policies=("round-robin", "adaptive"), model="m",
        results=str(results),
    )  # fmt: skip
    await Replayer(opts).run()
    out, page = tmp_path / "merged.json", tmp_path / "pages" / "merged.html"
    assert merge_main([str(results), "--out", str(out), "--html", str(page)]) == 0
    html = page.read_text()
    embedded = re.search(r'<script type="application/json" id="(\w+)">(.*?)</script>', html, re.S)
    assert embedded is not None and embedded.group(1) == "report"
    assert orjson.loads(embedded.group(2)) == orjson.loads(out.read_bytes())
    # the CDFs' points come with the report, merged from the results lines as well
    report = orjson.loads(out.read_bytes())
    assert [r["policy"] for r in report["runs"]] == ["round-robin", "adaptive"]
    assert all(len(r["cdf"]["all"]["ttft"]) == REQUESTS for r in report["runs"])
    assert "merged from 1 results file" in html


def test_merged_table_names_the_merge_not_a_target(tmp_path: Path) -> None:
    line = (
        b'{"custom_id":"a","url":"/v1/chat/completions","body":{},"t_offset_ms":0,'
        b'"route":{"policy":"p"},"resp":{"status":200,"stream":false,'
        b'"usage":{"completion_tokens":3}},"obs":{"ttft_ms":5,"e2e_ms":9}}\n'
    )
    paths = []
    for i in range(2):
        path = tmp_path / f"results-{i}.jsonl"
        path.write_bytes(line.replace(b'"a"', f'"a{i}"'.encode()))
        paths.append(str(path))
    title = render_tables(_merged(paths)).splitlines()[0]
    assert title == "merged from 2 results files"
    assert "None" not in title

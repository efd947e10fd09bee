"""The HTML report in Debian's headless chromium: no console errors, the report's numbers."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest

from replay.simulate.cli import main as simulate_main
from tests.fixtures import AZURE
from tests.procs import run_replay, start_emulator
from tests.router.harness import base_config, start_router, write_config

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _Charts(HTMLParser):
    """Every ``svg.chart`` of a page's DOM: its declared series, and per series (a ``g`` of
    class ``series`` or ``curve``) how many marks it drew (lines, dots, bars)."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[tuple[str, int, list[int]]] = []
        self._series: list[int] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "svg" and "chart" in classes:
            self._series = []
            title = a.get("data-chart") or f"{a.get('data-metric')} {a.get('data-group')}"
            self.charts.append((title, int(a.get("data-series") or 0), self._series))
        elif tag == "g" and self._series is not None and {"series", "curve"} & set(classes):
            self._series.append(0)
        elif tag in ("polyline", "circle", "rect") and self._series:
            self._series[-1] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._series = None


def _open(page: Path, profile: Path) -> str:
    """``page``'s DOM after its script ran in chromium, checked: self-contained, no console
    message, no uncaught error, and every chart drawn with every one of its series."""
    source = page.read_text()
    # self-contained: nothing to fetch (links within the page only)
    assert not re.search(
        r'(src|href)\s*=\s*"(?!#)|url\(|fetch\(|XMLHttpRequest|<link|import\(', source
    )

    assert CHROMIUM is not None
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    argv += ["--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ":CONSOLE" not in run.stderr, run.stderr  # the page logs nothing unless it fails
    dom = run.stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None and "data-error" not in body.group(1)
    charts = _Charts()
    charts.feed(dom)
    assert charts.charts and f'data-charts="{len(charts.charts)}"' in body.group(1)
    for title, declared, series in charts.charts:
        assert declared >= 1 and len(series) == declared, title
        assert all(marks >= 1 for marks in series), (title, series)
    return dom


def _charts(dom: str) -> list[str]:
    charts = _Charts()
    charts.feed(dom)
    return [title for title, _, _ in charts.charts]


def _check_page(page: Path, out: Path, profile: Path, requests: int = 20) -> str:
    """``page`` renders (see :func:`_open`) and its CDFs show ``out``'s numbers."""
    dom = _open(page, profile)
    report = orjson.loads(out.read_bytes())
    curves = re.findall(r'<g class="curve"([^>]*)>', dom)
    attrs = [dict(re.findall(r'([\w-]+)="([^"]*)"', c)) for c in curves]
    # runs x 2 metrics x (all + classes)
    groups = 1 + len(report["runs"][0]["by_class"])
    assert len(attrs) == len(report["runs"]) * 2 * groups
    for run in report["runs"]:
        m, name = run["overall"], run["policy"] or "target"
        mine = [a for a in attrs if a["data-run"] == name]
        shown = {(a["data-mean-ms"], a["data-p95-ms"], a["data-n"]) for a in mine}
        n = str(requests)
        assert (f"{m['mean_ttft_ms']:.1f}", f"{m['p95_ttft_ms']:.1f}", n) in shown
        assert (f"{m['mean_e2el_ms']:.1f}", f"{m['p95_e2el_ms']:.1f}", n) in shown
        label = f"{name}: mean {m['mean_ttft_ms']:.1f} ms, P95 {m['p95_ttft_ms']:.1f} ms"
        assert label in dom
    # the timeline's charts: one line per run in each
    titles = _charts(dom)
    for title in ("Arrival rate", "In flight", "Errors"):
        assert any(t.startswith(title) for t in titles), title
    for cls in report["runs"][0]["by_class"]:
        assert f"TTFT P95 (solid) and P50 (dashed), class {cls}" in titles
    return dom


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: the HTML report was not checked in a browser "
    "(`make browser`, part of `make test`, installs it)",
)
def test_report_page_renders_the_verdict_and_every_chart(tmp_path: Path) -> None:
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    results = tmp_path / "results.jsonl"
    with start_emulator("deepinfer", time_scale=50, seed=1) as emu:
        config = write_config(tmp_path, base_config([("di", "deepinfer", emu.url)]))
        with start_router(config) as r:
            args = ["--target", r.url, "--max-requests", "20", "--speed", "20", "--aa"]
            args += ["--policy", "round-robin", "--policy", "class-split", "--price", "di=40"]
            args += ["--out", str(out), "--html", str(page), "--results", str(results)]
            p = run_replay(str(AZURE), *args)
    assert p.returncode == 0, p.stderr
    report = orjson.loads(out.read_bytes())
    line = report["comparison"]["lines"][0]
    assert p.stdout.splitlines()[0] == line  # the verdict heads the terminal's output...
    dom = _check_page(page, out, tmp_path / "profile")
    verdicts = re.search(r'<div id="verdicts">(.*?)</div>', dom, re.S)
    assert verdicts is not None and html.escape(line, quote=False) in verdicts.group(
        1
    )  # ...and the page
    assert "round-robin (A/A)" in dom and 'id="comparison"' in dom and 'id="cost"' in dom
    # replay merge --html writes the same page, from the results lines
    merged_out, merged_page = tmp_path / "merged.json", tmp_path / "merged" / "merged.html"
    m = run_replay("merge", str(results), "--out", str(merged_out), "--html", str(merged_page))
    assert m.returncode == 0, m.stderr
    _check_page(merged_page, merged_out, tmp_path / "profile-merged")
    assert "merged from 1 results file" in merged_page.read_text()
    # the same trace in virtual time, against the live report: the simulator's error panel
    sim_out = tmp_path / "simulated.json"
    argv = [str(AZURE), "--config", str(config), "--profile", "di=deepinfer"]
    argv += ["--max-requests", "20", "--speed", "20", "--policy", "round-robin"]
    assert simulate_main([*argv, "--out", str(sim_out)]) == 0
    compared, compared_page = tmp_path / "compared.json", tmp_path / "compared.html"
    c = run_replay("compare", str(out), str(sim_out), "--out", str(compared))
    assert c.returncode == 0, c.stderr
    c = run_replay("compare", str(out), str(sim_out), "--html", str(compared_page))
    assert c.returncode == 0, c.stderr
    assert "Simulated (simulated: round-robin) against live (report: round-robin):" in c.stdout
    dom = _open(compared_page, tmp_path / "profile-compared")
    assert "simulated: round-robin against report: round-robin: error in TTFT [95% CI]" in dom
    assert "error in other metrics" in dom


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (`make browser` installs it)")
def test_a_single_run_page_is_complete(tmp_path: Path) -> None:
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    with start_emulator("vllm", time_scale=50, seed=1) as emu:  # an engine: no router, no policy
        args = ["--target", emu.url, "--max-requests", "20", "--speed", "20"]
        p = run_replay(str(AZURE), *args, "--out", str(out), "--html", str(page))
    assert p.returncode == 0, p.stderr
    dom = _check_page(page, out, tmp_path / "profile")
    assert 'id="comparison"' not in dom and 'id="verdicts"></div>' in dom  # nothing to compare
    for section in ("tables", "timeline", "backends", "slowest", "cdfs"):
        assert f'<section id="{section}">' in dom, section
    assert "Share of class" in dom


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (`make browser` installs it)")
def test_sweep_page_draws_one_pareto_point_per_run(tmp_path: Path) -> None:
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    # long prompts are batch under the embedded default's rules: both axes have data
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 100 * i, "input_length": 17_000 if i % 3 == 0 else 800, "output_length": 30}
        for i in range(30)
    ]
    trace.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    argv = [str(trace), "--policy", "adaptive", "--policy", "class-split"]
    argv += ["--set", "policies.adaptive.params.spill.max_inflight=1,8"]
    assert simulate_main([*argv, "--out", str(out), "--html", str(page)]) == 0
    report = orjson.loads(out.read_bytes())
    assert len(report["pareto"]) == 4 and any(p["front"] for p in report["pareto"])

    dom = _open(page, tmp_path / "profile")
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None and 'data-pareto="4"' in body.group(1)
    points = [
        dict(re.findall(r'([\w-]+)="([^"]*)"', g))
        for g in re.findall(r'<g class="point"([^>]*)>', dom)
    ]
    shown = {(p["data-run"], p["data-x"], p["data-y"], p["data-front"]) for p in points}
    expected = {
        (
            p["run"],
            f"{p['batch_output_throughput']:.2f}",
            f"{p['p95_ttft_ms']:.2f}",
            str(p["front"]).lower(),
        )
        for p in report["pareto"]
    }
    assert shown == expected

"""The HTML report in Debian's headless chromium: no console errors, the report's numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
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


def _check_page(page: Path, out: Path, profile: Path) -> None:
    """``page`` renders in chromium without console errors and shows ``out``'s numbers."""
    source = page.read_text()
    # self-contained: nothing to fetch
    assert not re.search(r"(src|href)\s*=|url\(|fetch\(|XMLHttpRequest|<link|import\(", source)

    assert CHROMIUM is not None
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    argv += ["--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ":CONSOLE" not in run.stderr, run.stderr  # the page logs nothing unless it fails
    dom = run.stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None and "data-error" not in body.group(1)

    report = orjson.loads(out.read_bytes())
    curves = re.findall(r'<g class="curve"([^>]*)>', dom)
    attrs = [dict(re.findall(r'([\w-]+)="([^"]*)"', c)) for c in curves]
    # 2 runs x 2 metrics x (all + classes)
    groups = 1 + len(report["runs"][0]["by_class"])
    assert len(attrs) == 2 * 2 * groups
    assert f'data-rendered="{len(attrs)}"' in body.group(1)
    for run in report["runs"]:
        m = run["overall"]
        mine = [a for a in attrs if a["data-run"] == run["policy"]]
        shown = {(a["data-mean-ms"], a["data-p95-ms"], a["data-n"]) for a in mine}
        assert (f"{m['mean_ttft_ms']:.1f}", f"{m['p95_ttft_ms']:.1f}", "20") in shown
        assert (f"{m['mean_e2el_ms']:.1f}", f"{m['p95_e2el_ms']:.1f}", "20") in shown
        label = f"{run['policy']}: mean {m['mean_ttft_ms']:.1f} ms, P95 {m['p95_ttft_ms']:.1f} ms"
        assert label in dom
    assert dom.count("<polyline") == len(attrs)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: the HTML report was not checked in a browser "
    "(`make browser`, part of `make test`, installs it)",
)
def test_report_page_renders_the_report_numbers(tmp_path: Path) -> None:
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    results = tmp_path / "results.jsonl"
    with (
        start_emulator("deepinfer", time_scale=50, seed=1) as emu,
        start_router(write_config(tmp_path, base_config([("di", "deepinfer", emu.url)]))) as r,
    ):
        args = ["--target", r.url, "--max-requests", "20", "--speed", "20"]
        args += ["--policy", "round-robin", "--policy", "class-split"]
        args += ["--out", str(out), "--html", str(page), "--results", str(results)]
        p = run_replay(str(AZURE), *args)
    assert p.returncode == 0, p.stderr
    _check_page(page, out, tmp_path / "profile")
    # replay merge --html writes the same page, from the results lines
    merged_out, merged_page = tmp_path / "merged.json", tmp_path / "merged" / "merged.html"
    m = run_replay("merge", str(results), "--out", str(merged_out), "--html", str(merged_page))
    assert m.returncode == 0, m.stderr
    _check_page(merged_page, merged_out, tmp_path / "profile-merged")
    assert f"Merged from {results}" in merged_page.read_text()


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

    assert CHROMIUM is not None
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    argv += ["--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ":CONSOLE" not in run.stderr, run.stderr
    body = re.search(r"<body([^>]*)>", run.stdout)
    assert body is not None and "data-error" not in body.group(1)
    assert 'data-pareto="4"' in body.group(1)
    points = [
        dict(re.findall(r'([\w-]+)="([^"]*)"', g))
        for g in re.findall(r'<g class="point"([^>]*)>', run.stdout)
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

"""The HTML report in Debian's headless chromium: no console errors, the report's numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.fixtures import AZURE
from tests.procs import run_replay, start_emulator

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


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: the HTML report was not checked in a browser "
    "(`make browser`, part of `make test`, installs it)",
)
def test_report_page_renders_the_report_numbers(tmp_path: Path) -> None:
    out, page = tmp_path / "report.json", tmp_path / "report.html"
    with start_emulator("deepinfer", time_scale=50, seed=1) as emu:
        args = ["--target", emu.url, "--max-requests", "20", "--speed", "20"]
        args += ["--policy", "round-robin", "--policy", "adaptive"]
        args += ["--out", str(out), "--html", str(page)]
        p = run_replay(str(AZURE), *args)
    assert p.returncode == 0, p.stderr
    source = page.read_text()
    # self-contained: nothing to fetch
    assert not re.search(r"(src|href)\s*=|url\(|fetch\(|XMLHttpRequest|<link|import\(", source)

    assert CHROMIUM is not None
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
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

"""Every example the README and docs/ show runs, as written, in the project's environment.

Each fenced ```python block of README.md and docs/*.md is run as its own script by this
environment's interpreter, in a temporary directory, against a real router this module
starts: the embedded default (config/router.yaml, Batch API included) with its emulated
engines and its time-dependent settings scaled to run 20 times faster, on a free loopback
port. The documented address ``http://127.0.0.1:8080`` is replaced by that router's. A block
passes when it exits 0.

A block that cannot run here (it needs a GPU cluster, a collector, a key of a real service)
says so in its first line, visibly in the rendered page::

    # not run by the doc tests: <why>

Such blocks are skipped and listed with their reason in the run's summary (``-rs``); keep
them few.

Every ``turnout check-config FILE`` command the pages give for a file of the repository is run
as written, and so is ``check-config`` on every router config under config/ the pages name
(config/engines/ holds emulator profiles, not router configs): each must pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.mixed_workload import DEFAULT_CONFIG, scaled_config
from tests.procs import ROOT, Process
from tests.router.harness import start_router, write_config

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCUMENTED = "http://127.0.0.1:8080"
NOT_RUN = "# not run by the doc tests:"
SCALE = 20.0
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
CHECK = re.compile(r"turnout check-config (\S+)")
NAMED_CONFIG = re.compile(r"(?<![\w./-])(config/(?!engines/)[\w./-]+\.yaml)")


@dataclass(frozen=True)
class Block:
    where: str
    code: str


def python_blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(Block(f"{page.relative_to(ROOT)}:{line}", m.group(1)))
    return out


BLOCKS = python_blocks()


def documented_checks() -> list[str]:
    """The files of ``turnout check-config FILE`` commands that name one of the repository."""
    found = {
        m.group(1)
        for page in PAGES
        for m in CHECK.finditer(page.read_text(encoding="utf-8"))
        if (ROOT / m.group(1)).is_file()
    }
    return sorted(found)


def named_configs() -> list[str]:
    found = {
        m.group(1)
        for page in PAGES
        for m in NAMED_CONFIG.finditer(page.read_text(encoding="utf-8"))
    }
    return sorted(found)


def test_the_pages_hold_examples_to_run() -> None:
    # Guards the extraction itself: a pattern that found nothing would pass every test below.
    assert len(BLOCKS) >= 4, [b.where for b in BLOCKS]
    assert "config/examples/b200-deepinfer-vllm.yaml" in documented_checks()
    assert "config/router.yaml" in named_configs()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    work = tmp_path_factory.mktemp("doc-router")
    doc = scaled_config(DEFAULT_CONFIG, SCALE, 0)
    doc["batch"] = {**doc["batch"], "data_dir": str(work / "data")}
    with start_router(write_config(work, doc), timeout=60) as proc:
        yield proc


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_python_example_runs(block: Block, router: Process, tmp_path: Path) -> None:
    first = block.code.splitlines()[0] if block.code.strip() else ""
    if first.startswith(NOT_RUN):
        reason = first.removeprefix(NOT_RUN).strip()
        assert reason, f"{block.where}: say why it is not run"
        pytest.skip(f"{block.where}: {reason}")
    assert DOCUMENTED in block.code, f"{block.where} talks to no documented router address"
    script = tmp_path / "example.py"
    script.write_text(block.code.replace(DOCUMENTED, router.url), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{block.where} printed nothing"


@pytest.mark.parametrize("path", sorted({*documented_checks(), *named_configs()}))
def test_documented_config_passes_check_config(path: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnout", "check-config", path],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{path}: ok (" in done.stdout

"""The README and docs/ stay true to the repository: links, anchors, paths, modules, length.

Links and anchors are checked the way a code host renders them: a relative link must name a
file or folder of the repository, and a ``#anchor`` must be the slug of a heading in the
target page (lowercased, punctuation dropped, spaces turned into hyphens, repeats numbered).
Paths are checked wherever they appear in the text (inline code, code blocks, prose): a
token that starts with one of the repository's top-level folders, such as
``router/proxy/handler.py`` or ``config/router.yaml``, must exist. So must every module
named in a ``python -m`` command. The header comment of every config file names the docs page
(and section) that documents it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 250

# Top-level folders of the repository: a token starting with one of these is a repo path.
TOP_DIRS = (
    "router",
    "policies",
    "replay",
    "emulator",
    "turnout",
    "config",
    "deploy",
    "benchmarks",
    "examples",
    "tests",
    "docs",
)
PATH_RE = re.compile(r"(?<![\w./$~-])((?:" + "|".join(TOP_DIRS) + r")/[\w./-]*)")
MODULE_RE = re.compile(r"(?<![\w.-])-m\s+([A-Za-z_][\w.]*)")
LINK_RE = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)\)")
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^ {0,3}(```|~~~)")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Numbered lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE_RE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """The anchor a code host gives a heading's text (GitHub's rule)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").lower()
    kept = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch in " -" or category[0] in "LMN" or category == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page, repeated headings numbered as rendered."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING_RE.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> Iterator[tuple[int, str]]:
    """Numbered link targets outside fenced code blocks (images skipped)."""
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for m in LINK_RE.finditer(line):
            yield number, m.group(2)


def _is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) is not None


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page: Path) -> None:
    problems = []
    for number, target in links(page):
        if _is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{_name(page)}:{number}: ({target})"
        if not dest.is_relative_to(ROOT):
            problems.append(f"{where} points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where} names a missing file")
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where} has an anchor but is not a Markdown page")
            elif anchor not in anchors(dest):
                problems.append(f"{where} names no heading of {_name(dest)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_repo_paths_exist(page: Path) -> None:
    problems = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in PATH_RE.finditer(line):
            path = m.group(1).rstrip(".,;:")
            if not (ROOT / path).exists():
                problems.append(f"{_name(page)}:{number}: {path} does not exist")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_m_modules_exist(page: Path) -> None:
    problems = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in MODULE_RE.finditer(line):
            module = m.group(1).rstrip(".")
            if module.split(".")[0] not in TOP_DIRS:
                continue  # not ours (pip, venv, ...)
            base = ROOT.joinpath(*module.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{_name(page)}:{number}: python -m {module}: no such module")
    assert not problems, "\n".join(problems)


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; the reference goes in docs/"


def test_readme_maps_every_docs_page() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in links(README)
        if not _is_external(target)
    }
    unlisted = [_name(p) for p in DOCS if p.resolve() not in linked]
    assert DOCS, "docs/ holds no pages"
    assert not unlisted, f"README.md does not link {unlisted}"


def test_quick_start_commands_are_make_targets() -> None:
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^ {4}(\S.*)$", quick, re.MULTILINE)
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"Makefile has no {target}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Run it", "run-it"),
        ("`pipeline`: compose your own", "pipeline-compose-your-own"),
        ("1. Capture at the router", "1-capture-at-the-router"),
        (
            "Adaptive routing: pools, load signals, admission, shadow, goodput",
            "adaptive-routing-pools-load-signals-admission-shadow-goodput",
        ),
        ("Capture → replay", "capture--replay"),
        ("snake_case stays", "snake_case-stays"),
    ],
)
def test_slug_follows_the_code_host(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


CONFIGS = [*sorted((ROOT / "config").rglob("*.yaml")), ROOT / "deploy/kubernetes/configmap.yaml"]
DOC_REF = re.compile(r"docs/([\w-]+\.md)(?: \(([^;)]+))?")


def header(path: Path) -> str:
    """A YAML file's leading comment, as one line of text."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize("path", CONFIGS, ids=_name)
def test_config_headers_point_at_the_docs(path: Path) -> None:
    refs = DOC_REF.findall(header(path))
    assert refs, f"{_name(path)}: its header names no docs/ page"
    for page, section in refs:
        target = ROOT / "docs" / page
        assert target.is_file(), f"{_name(path)}: docs/{page} does not exist"
        if section:
            assert slug(section.strip()) in anchors(target), (
                f"{_name(path)}: docs/{page} has no section {section.strip()!r}"
            )

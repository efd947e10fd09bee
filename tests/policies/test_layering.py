"""The import rule, checked over the whole repository with ast.

policies imports nothing from router, replay or emulator; replay imports only turnout.common
and itself; emulator imports only turnout.common and itself; turnout.common imports nothing
of the project's but itself (turnout.cli, the command, sits above everything). The one
exception is the simulator (replay/simulate): it runs the router's own policies and pool over
the engine models, so it imports them, and nothing else in replay imports it but the
command's lazy dispatch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Layers: the top-level packages, but turnout.common (the shared bottom layer) apart from the
# rest of turnout (the command on top).
PROJECT = ("router", "policies", "replay", "emulator", "turnout", "turnout.common", "benchmarks")
COMMON = "turnout.common"
ALLOWED: dict[str, set[str]] = {
    "policies": {"policies", COMMON},
    "replay": {"replay", COMMON},
    "emulator": {"emulator", COMMON},
    "replay/simulate": {"replay", COMMON, "router", "policies", "emulator"},
    "turnout/common": {COMMON},
}


def _layer(module: str) -> str:
    return COMMON if (module + ".").startswith(COMMON + ".") else module.split(".")[0]


def project_imports(path: Path) -> set[str]:
    """Project layers that ``path`` imports (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(_layer(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(_layer(node.module))
    return found & set(PROJECT)


def test_project_imports_finds_both_import_forms(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text(
        "import router.app\nfrom replay import x\nimport os\nfrom . import y\n"
        "from turnout.common.sse import StreamMeter\nfrom turnout.cli import main\n"
    )
    assert project_imports(sample) == {"router", "replay", "turnout.common", "turnout"}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layering(package: str) -> None:
    files = sorted(
        f
        for f in (ROOT / package).rglob("*.py")
        if not any(
            f.is_relative_to(ROOT / other)
            for other in ALLOWED
            if other != package and other.startswith(package + "/")
        )
    )
    assert files, f"no modules found under {package}/"
    bad = {
        str(f.relative_to(ROOT)): sorted(project_imports(f) - ALLOWED[package])
        for f in files
        if project_imports(f) - ALLOWED[package]
    }
    assert not bad, f"{package} imports outside its layer: {bad}"

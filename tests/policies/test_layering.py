"""The import rule, checked over the whole repository with ast.

policies imports nothing from router, replay or emulator; replay imports only common and
itself; emulator imports only common and itself. The one exception is the simulator
(replay/simulate): it runs the router's own policies and pool over the engine models, so
it imports them, and nothing else in replay imports it but the command's lazy dispatch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("router", "policies", "replay", "emulator", "common", "config", "benchmarks")
ALLOWED: dict[str, set[str]] = {
    "policies": set(PROJECT) - {"router", "replay", "emulator"},
    "replay": {"replay", "common"},
    "emulator": {"emulator", "common"},
    "replay/simulate": {"replay", "common", "router", "policies", "emulator"},
}


def project_imports(path: Path) -> set[str]:
    """Top-level project packages that ``path`` imports (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PROJECT)


def test_project_imports_finds_both_import_forms(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import router.app\nfrom replay import x\nimport os\nfrom . import y\n")
    assert project_imports(sample) == {"router", "replay"}


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

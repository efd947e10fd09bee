"""Inside router/, imports only point down the request's layers.

Bottom up: config (the frozen model and its parser), server (errors, the guarded site,
child processes), observe (metrics, capture), backends (pool, breaker, health), control
(auth, admission, classification), proxy (the request path), batch (the Batch API, whose
lines take the request path). The top-level modules (app,
cli, workers, reload, __main__) compose them and may import any layer; no layer imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROUTER = Path(__file__).resolve().parents[2] / "router"
LAYERS = ("config", "server", "observe", "backends", "control", "proxy", "batch")


def router_imports(path: Path) -> set[str]:
    """The router subpackages (or top-level modules) that ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(n.split(".")[1] for n in names if n.startswith("router.") and "." in n)
    return found


def test_router_imports_reads_both_import_forms(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import router.proxy.relay\nfrom router.config.model import X\nimport os\n")
    assert router_imports(sample) == {"proxy", "config"}


def test_every_subpackage_has_a_layer() -> None:
    packages = {p.name for p in ROUTER.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_down(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    bad = {
        str(f.relative_to(ROUTER)): sorted(router_imports(f) - allowed)
        for f in sorted((ROUTER / layer).rglob("*.py"))
        if router_imports(f) - allowed
    }
    assert not bad, f"router/{layer} imports a layer above it: {bad}"

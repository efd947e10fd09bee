"""The Kubernetes manifests of deploy/kubernetes, loaded once, and small helpers over them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.procs import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
_VAR = re.compile(r"\$\((\w+)\)")


@dataclass(frozen=True)
class Manifest:
    """One document of one file."""

    path: Path
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])


def load_manifests(directory: Path = KUBE) -> list[Manifest]:
    """Every non-empty YAML document under ``directory``, in file order."""
    out: list[Manifest] = []
    for path in sorted(directory.glob("*.yaml")):
        with path.open(encoding="utf-8") as f:
            out.extend(Manifest(path, d) for d in yaml.safe_load_all(f) if d is not None)
    return out


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in manifests if m.kind == kind and (name is None or m.name == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command and args (unknown names are kept as is)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), arg)


def flag(argv: list[str], name: str) -> str:
    """The value after ``name`` in ``argv``."""
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


def container_port(container: dict[str, Any], port: int | str) -> int:
    """Resolve a probe's or Service's port (a number or a container port's name)."""
    if isinstance(port, int):
        return port
    names = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    assert port in names, f"no container port named {port!r}"
    return int(names[port])


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

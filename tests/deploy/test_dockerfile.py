"""The Dockerfile, checked without a Docker engine: what it copies exists and is not ignored,
it installs the package of pyproject.toml, and its command and health check really work."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

from tests.deploy.dockerfile import Stage, copy_sources, read_dockerfile
from tests.procs import ROOT, start_process
from tests.router.harness import READY

STAGES = read_dockerfile(ROOT / "Dockerfile")
FINAL = STAGES[-1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """True when ``path`` or one of its parents matches a (non-negated) .dockerignore line."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.rstrip("/"))
        for pattern in patterns
        if not pattern.startswith("!")
        for prefix in prefixes
    )


def context_copies(stage: Stage) -> list[tuple[str, str]]:
    """(source, destination) of every COPY from the build context (not from a stage)."""
    out: list[tuple[str, str]] = []
    for instruction in stage.all("COPY"):
        sources, dest, from_stage = copy_sources(instruction)
        if from_stage is None:
            out.extend((s, dest) for s in sources)
    return out


def test_is_multi_stage_on_a_slim_python_base() -> None:
    assert len(STAGES) >= 2
    assert all(s.base.startswith("python:3.11-slim") for s in STAGES)
    assert STAGES[0].name, "the build stage is named so the final stage can copy from it"
    assert any(copy_sources(c)[2] == STAGES[0].name for c in FINAL.all("COPY")), (
        "the final stage takes the build stage's wheels"
    )


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    patterns = ignore_patterns()
    copies = [c for stage in STAGES for c in context_copies(stage)]
    assert copies
    for source, _ in copies:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
        assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"


def test_dockerignore_keeps_the_build_small() -> None:
    patterns = ignore_patterns()
    for path in (".venv", ".git", "tests", ".mypy_cache", "router/__pycache__"):
        assert ignored(path, patterns), f"{path} would be sent to the Docker daemon"


def test_builds_the_package_that_pyproject_describes() -> None:
    build = STAGES[0]
    copied = {PurePosixPath(s).parts[0] for s, _ in context_copies(build)}
    assert "pyproject.toml" in copied
    assert PYPROJECT["project"]["readme"] in copied
    packages = {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]}
    assert packages <= copied, f"packages not copied into the build: {packages - copied}"
    runs = [r.args for r in build.all("RUN")]
    assert any("pip wheel" in r and r.rstrip().endswith(" .") for r in runs)
    name = PYPROJECT["project"]["name"]
    final_runs = " ".join(r.args for r in FINAL.all("RUN"))
    assert "pip install" in final_runs and name in final_runs.split()


def test_runs_as_a_non_root_user() -> None:
    users = FINAL.all("USER")
    assert users, "the final stage must set USER"
    user = users[-1].args.split(":")[0]
    assert user not in {"root", "0"}


def test_default_command_is_router_serve_on_the_exposed_port() -> None:
    argv = FINAL.all("CMD")[-1].exec_form()
    assert argv[0] in PYPROJECT["project"]["scripts"], f"{argv[0]} is not a console script"
    assert argv[:2] == ["turnout", "serve"]
    config = argv[argv.index("--config") + 1]
    destinations = {dest for _, dest in context_copies(FINAL)}
    assert config in destinations, "the default config is baked into the image"
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert [e.args for e in FINAL.all("EXPOSE")] == [port]
    check = " ".join(FINAL.all("HEALTHCHECK")[-1].exec_form())
    assert f":{port}/health" in check


def test_command_and_health_check_work(tmp_path: Path) -> None:
    """Run the image's CMD with this venv's console script (on a free loopback port) and its
    HEALTHCHECK against it: healthy while the router runs, unhealthy once it has stopped."""
    argv = FINAL.all("CMD")[-1].exec_form()
    image_port = argv[argv.index("--port") + 1]
    config = next(s for s, d in context_copies(FINAL) if d == argv[argv.index("--config") + 1])
    argv[0] = str(Path(sys.executable).parent / argv[0])
    argv[argv.index("--config") + 1] = str(ROOT / config)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = "0"
    check = FINAL.all("HEALTHCHECK")[-1].exec_form()
    assert check[0] == "python"
    check[0] = sys.executable
    with start_process(argv, READY, timeout=60) as router:
        port = router.url.rsplit(":", 1)[1]
        probe = [a.replace(f":{image_port}/", f":{port}/") for a in check]
        ok = subprocess.run(probe, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    down = subprocess.run(probe, capture_output=True, timeout=30)
    assert down.returncode != 0

"""The wheel as a user gets it: built, installed into a fresh virtualenv with nothing else,
and run from a directory whose own ``config.py`` and ``common.py`` would shadow a package
of those names.

Offline: the wheel is built and installed from the wheelhouse `make setup` fills
(``.venv/wheelhouse``: the dependencies and the build backend), so the test sends nothing
beyond loopback. One module-scoped install serves every test here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.procs import ROOT, start_process
from tests.router.harness import READY

WHEELHOUSE = ROOT / ".venv" / "wheelhouse"
TOP_LEVEL = {"emulator", "policies", "replay", "router", "turnout"}
# What a user's working directory may hold without breaking the installed router.
SHADOWS = ("config", "common")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    bin: Path
    env: dict[str, str]


def _run(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    if not (WHEELHOUSE / ".stamp").exists():
        pytest.fail("no wheelhouse: run `make wheelhouse` (`make test` does) to fetch it once")
    base = tmp_path_factory.mktemp("install")
    offline = ["--no-index", "--find-links", str(WHEELHOUSE), "--quiet"]
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline,
                  "--wheel-dir", str(base / "dist"), str(ROOT)])  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("turnout-*.whl")
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    bin_dir = venv / "bin"
    done = _run([str(bin_dir / "python"), "-m", "pip", "install", *offline, str(wheel)])
    assert done.returncode == 0, done.stderr[-3000:]
    # Nothing of the test's own environment leaks in: no PYTHONPATH, no project venv on PATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/bin:/bin"
    env["XDG_DATA_HOME"] = str(base / "data")  # whatever the router stores stays in tmp
    yield Installed(wheel=wheel, bin=bin_dir, env=env)


def test_the_wheel_claims_only_its_own_import_names(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
        (top_level,) = (n for n in names if n.endswith(".dist-info/top_level.txt"))
        declared = set(z.read(top_level).decode().split())
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = z.read(entry_points).decode()
    shipped = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert declared == shipped == TOP_LEVEL
    assert "turnout/config/router.yaml" in names  # the embedded default, as package data
    assert {"turnout/config/engines/vllm.yaml", "turnout/config/engines/deepinfer.yaml"} <= set(
        names
    )
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    console = {line.split("=")[0].strip() for line in scripts.splitlines() if "=" in line}
    assert console == {"turnout", "replay"}


def test_the_base_install_carries_no_extra(installed: Installed) -> None:
    listed = _run([str(installed.bin / "python"), "-m", "pip", "list", "--format=freeze"])
    packages = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "turnout" in packages
    assert not packages & {"psycopg", "psycopg-binary", "opentelemetry-sdk", "openai"}


def test_the_commands_answer(installed: Installed, tmp_path: Path) -> None:
    env, bin_dir = installed.env, installed.bin
    helped = _run([str(bin_dir / "turnout"), "--help"], env=env, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("serve", "check-config", "print-default-config", "replay", "emulator"):
        assert f"\n  {command} " in helped.stdout, helped.stdout
    version = _run([str(bin_dir / "turnout"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout.startswith("turnout 0."), version.stdout
    replay = _run([str(bin_dir / "replay"), "--help"], env=env, cwd=tmp_path)
    assert replay.returncode == 0 and "usage: replay" in replay.stdout, replay.stderr
    assert not (bin_dir / "router").exists() and not (bin_dir / "emulator").exists()


def test_check_config_passes_the_packaged_default(installed: Installed, tmp_path: Path) -> None:
    where = _run(
        [str(installed.bin / "python"), "-c",
         "from importlib.resources import files; print(files('turnout.config') / 'router.yaml')"],
        env=installed.env, cwd=tmp_path,
    )  # fmt: skip
    packaged = Path(where.stdout.strip())
    assert packaged.is_relative_to(installed.bin.parent), packaged  # the venv's, not the repo's
    checked = _run(
        [str(installed.bin / "turnout"), "check-config", str(packaged)],
        env=installed.env,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stderr
    assert ": ok (" in checked.stdout
    printed = _run([str(installed.bin / "turnout"), "print-default-config"], env=installed.env)
    assert printed.stdout == packaged.read_text(encoding="utf-8")


@pytest.mark.parametrize("entry", ["script", "module"])
def test_serves_from_a_directory_that_shadows_config_and_common(
    installed: Installed, tmp_path: Path, entry: str
) -> None:
    """``turnout serve`` (and ``python -m turnout serve``) with the embedded default, from a
    directory holding a ``config.py`` and a ``common.py`` that fail loudly if imported; the
    emulator children start in that directory too."""
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('imported the user\\'s {name}')\n")
    argv = {
        "script": [str(installed.bin / "turnout"), "serve", "--port", "0"],
        "module": [str(installed.bin / "python"), "-m", "turnout", "serve", "--port", "0"],
    }[entry]
    with start_process(argv, READY, timeout=60, cwd=tmp_path, env=installed.env) as router:
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="deepseek-v4.1-flash",
            messages=[{"role": "user", "content": "Hello from a fresh install"}],
            max_tokens=8,
        )
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens == 8

"""Profiles: shipped ones load, bad ones report every error with its key path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from emulator.profiles import ENGINES_DIR, ProfileError, load_profile
from tests.emulator.conftest import client_for
from tests.procs import start_emulator


@pytest.mark.parametrize("name", sorted(p.stem for p in ENGINES_DIR.glob("*.yaml")))
def test_shipped_profiles_load(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name and profile.model == "deepseek-v4.1-flash"


def test_every_error_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nscheduling: lazy\nranks: 0\nstep_base_ms: -1\nfrobs: 3\n"
        "faults: {error_status: 418, bogus: 1}\n"
    )
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    text = "\n".join(info.value.errors)
    needles = (
        "scheduling: unknown 'lazy'",
        "ranks: must be at least 1",
        "step_base_ms:",
        "frobs: unknown key",
        "faults.error_status",
        "faults.bogus: unknown key",
    )
    for needle in needles:
        assert needle in text


def test_overrides_apply_and_are_validated() -> None:
    profile = load_profile("vllm", {"ranks": 2, "faults.max_waiting": 4})
    assert profile.ranks == 2 and profile.faults.max_waiting == 4
    with pytest.raises(ProfileError):
        load_profile("vllm", {"scheduling_policy": "lottery"})


def test_cli_rejects_a_bad_profile_with_exit_2() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "turnout", "emulator", "--profile", "no-such-engine", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert run.returncode == 2 and "known: " in run.stderr


def test_profile_path_and_model_override(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel: tiny-model\nmax_model_len: 4096\n")
    with start_emulator(str(path), time_scale=100, args=["--model", "renamed"]) as emu:
        card = client_for(emu).models.list().data[0].model_dump()
    assert card["id"] == "renamed" and card["max_model_len"] == 4096


def test_cli_reports_a_taken_port_with_exit_1() -> None:
    with start_emulator("vllm", time_scale=100) as emu:
        port = emu.url.rsplit(":", 1)[1]
        run = subprocess.run(
            [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port", port],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert run.returncode == 1 and "cannot listen" in run.stderr

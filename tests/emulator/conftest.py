"""Shared emulator processes for the HTTP tests (one per profile per module)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.procs import Emulator, start_emulator


@pytest.fixture(scope="module")
def vllm() -> Iterator[Emulator]:
    with start_emulator("vllm", time_scale=100) as emu:
        yield emu


@pytest.fixture(scope="module")
def deepinfer() -> Iterator[Emulator]:
    with start_emulator("deepinfer", time_scale=100) as emu:
        yield emu


@pytest.fixture(params=["vllm", "deepinfer"])
def emu(request: pytest.FixtureRequest) -> Emulator:
    """Each test using this runs against both profiles."""
    emu: Emulator = request.getfixturevalue(request.param)
    return emu


def client_for(emu: Emulator) -> openai.OpenAI:
    """The official client, no retries (so injected errors surface as they are)."""
    return openai.OpenAI(base_url=emu.url + "/v1", api_key="unused", max_retries=0, timeout=30)

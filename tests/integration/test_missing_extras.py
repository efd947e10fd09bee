"""A config or environment that needs an extra that is not installed gets a message naming
the install that fixes it, not an ImportError: real processes whose interpreter cannot import
the extra's module (a stub package earlier on PYTHONPATH raises ImportError, as a missing
module does), beside a control run that can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ROOT, start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config

PG = "postgresql://turnout@127.0.0.1:1/turnout"


def without(module: str, tmp_path: Path) -> dict[str, str]:
    """This process's environment, for a child to which ``module`` cannot be imported."""
    stubs = tmp_path / f"no-{module}"
    (stubs / module).mkdir(parents=True)
    (stubs / module / "__init__.py").write_text(
        f'raise ImportError("No module named {module!r} (a test stub)")\n'
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(stubs), str(ROOT)])}


def turnout(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnout", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_postgresql_store_without_psycopg_is_a_config_error(tmp_path: Path) -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:1")], batch={"store": PG})
    path = write_config(tmp_path, doc)
    control = turnout("check-config", str(path))
    assert control.returncode == 0, control.stderr  # psycopg is installed here
    env = without("psycopg", tmp_path)
    want = (
        "batch.store: a PostgreSQL store needs psycopg, which is not installed here: "
        "pip install 'turnout[postgres]'"
    )
    for args in (["check-config", str(path)], ["serve", "--config", str(path), "--port", "0"]):
        res = turnout(*args, env=env)
        assert res.returncode == 2, (args, res.stderr)
        assert want in res.stderr.splitlines(), res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("unimportable", "variables", "problem"),
    [
        (
            "opentelemetry",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
            "OTEL_EXPORTER_OTLP_ENDPOINT asks for it but the otel extra is not installed "
            "(No module named 'opentelemetry' (a test stub))",
        ),
        (
            None,  # the SDK is there, the exporter it is told to use is not
            {"OTEL_TRACES_EXPORTER": "no-such-exporter"},
            "OTEL_TRACES_EXPORTER asks for it but OTEL_TRACES_EXPORTER: no exporter named "
            "'no-such-exporter' is installed",
        ),
    ],
    ids=["no-extra", "no-exporter"],
)
def test_tracing_asked_for_without_the_extra_is_one_warning(
    tmp_path: Path, unimportable: str | None, variables: dict[str, str], problem: str
) -> None:
    env = without(unimportable, tmp_path) if unimportable else dict(os.environ)
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")} | variables
    log = tmp_path / "router.log"
    with start_emulator("vllm", time_scale=50) as emu:
        doc = base_config([("vllm", "vllm", emu.url)], access_log={"enabled": False})
        with start_router(
            write_config(tmp_path, doc), ["--workers", "2"], stderr=log, env=env
        ) as router:
            answer = client_for(router.url).completions.create(
                model="deepseek-v4.1-flash", prompt="hi", max_tokens=2
            )
            assert answer.choices[0].text  # served, untraced
    warnings = [line for line in log.read_text().splitlines() if "tracing is off" in line]
    assert len(warnings) == 1, warnings  # one for the router, not one per worker
    assert warnings[0].endswith(
        f"tracing is off: {problem}; pip install 'turnout[otel]' brings the SDK and its OTLP "
        "exporter"
    )
    assert "Traceback" not in log.read_text()

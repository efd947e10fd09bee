"""The ``batch`` section: where the default store goes (Turnout's data directory, after the
XDG convention) and what a config that names its own place keeps."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from router.batch.service import store_url
from router.cli import default_config_path, load_checked
from router.config.batch import data_home
from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.router.harness import base_config


def batch_doc(**batch: object) -> dict[str, object]:
    return base_config([("a", "vllm", "http://127.0.0.1:1")], batch=batch)


def test_the_embedded_default_keeps_its_store_in_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    settings = load_checked(default_config_path()).batch
    assert settings is not None
    assert store_url(settings) == f"sqlite:///{tmp_path}/turnout/batch.db"
    assert not (tmp_path / "turnout").exists()  # checking a config makes nothing


@pytest.mark.parametrize(
    ("xdg", "home", "want"),
    [
        ("/srv/xdg", "/home/u", "/srv/xdg/turnout"),
        ("", "/home/u", "/home/u/.local/share/turnout"),
        ("relative/xdg", "/home/u", "/home/u/.local/share/turnout"),  # ignored, as XDG says
        ("", "relative-home", None),
    ],
)
def test_data_home_follows_xdg(
    xdg: str, home: str, want: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", home)
    assert data_home({"XDG_DATA_HOME": xdg}) == (None if want is None else Path(want))


def no_passwd_entry(uid: int) -> pwd.struct_passwd:
    raise KeyError(uid)


def test_without_a_home_directory_the_config_says_what_to_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A container run under a uid that /etc/passwd does not know, and no HOME.
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_passwd_entry)
    with pytest.raises(ConfigError) as exc:
        parse_config(batch_doc())
    assert exc.value.errors == [
        ("batch.data_dir", "no home directory to keep batch.db in: give batch.data_dir, "
         "or set XDG_DATA_HOME"),
    ]  # fmt: skip
    # A config that names its place needs none.
    assert parse_config(batch_doc(data_dir="/var/lib/turnout")).batch is not None
    assert parse_config(batch_doc(store="sqlite:///var/batch.db")).batch is not None


def test_a_given_place_wins(tmp_path: Path) -> None:
    given = parse_config(batch_doc(data_dir=str(tmp_path))).batch
    assert given is not None and store_url(given) == f"sqlite:///{tmp_path}/batch.db"
    url = "postgresql://turnout@db.internal/turnout"
    pg = parse_config(batch_doc(store=url)).batch
    assert pg is not None and store_url(pg) == url

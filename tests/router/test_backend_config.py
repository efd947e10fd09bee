"""A backend's ``tls`` and ``discover`` sections: parsed into UpstreamTls and DnsDiscovery,
the TLS files loaded once, every mistake reported at its path without the files' contents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from router.config.backends import shown_url
from router.config.model import ConfigError, DnsDiscovery, UpstreamTls
from router.config.parse import parse_config
from router.server.children import emulator_argv
from tests.router.harness import base_config

HTTPS = "https://127.0.0.1:8443"


def _doc(tls: object, url: str = HTTPS) -> dict[str, Any]:
    doc = base_config([("a", "vllm", url)])
    doc["backends"][0]["tls"] = tls
    return doc


def _errors(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    return dict(exc.value.errors)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("router.client")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    leaf.private_key_pem.write_to_path(str(d / "client.key"))
    (d / "junk.pem").write_text("not a certificate\n")
    return {n: str(d / n) for n in ("ca.pem", "client.pem", "client.key", "junk.pem")}


def test_tls_settings_round_trip(files: dict[str, str]) -> None:
    tls = {
        "ca_file": files["ca.pem"],
        "cert_file": files["client.pem"],
        "key_file": files["client.key"],
        "server_name": "engine.internal",
    }
    spec = parse_config(_doc(tls)).backends[0]
    assert spec.tls == UpstreamTls(
        files["ca.pem"], files["client.pem"], files["client.key"], "engine.internal", True
    )
    assert parse_config(_doc({"verify": False})).backends[0].tls == UpstreamTls(verify=False)


def test_tls_mistakes_are_reported_at_their_paths(files: dict[str, str]) -> None:
    assert "backends[0].tls" in _errors(_doc({"ca_file": files["ca.pem"]}, "http://h:1"))
    half = _errors(_doc({"cert_file": files["client.pem"]}))
    assert "together" in half["backends[0].tls"]
    missing = _errors(_doc({"ca_file": files["ca.pem"] + ".gone"}))
    assert "No such file" in missing["backends[0].tls.ca_file"]
    junk = _errors(_doc({"ca_file": files["junk.pem"]}))["backends[0].tls.ca_file"]
    assert "not a certificate" not in junk  # the file's content is never shown
    swapped = {"cert_file": files["client.key"], "key_file": files["client.pem"]}
    assert "matching PEM key" in _errors(_doc(swapped))["backends[0].tls.cert_file"]
    pointless = _errors(_doc({"verify": False, "ca_file": files["ca.pem"]}))
    assert "backends[0].tls.verify" in pointless
    assert "backends[0].tls.ca" in _errors(_doc({"ca": files["ca.pem"]}))  # unknown key


def test_an_encrypted_key_is_refused_without_a_prompt(
    files: dict[str, str], tmp_path: Path
) -> None:
    key = serialization.load_pem_private_key(Path(files["client.key"]).read_bytes(), None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    tls = {"cert_file": files["client.pem"], "key_file": str(locked)}
    assert "encrypted" in _errors(_doc(tls))["backends[0].tls.key_file"]


def _discovered(discover: object, **extra: object) -> dict[str, Any]:
    doc = base_config([("pool", "vllm", "http://unused:1")])
    doc["backends"] = [{"name": "pool", "engine": "vllm", "discover": discover, **extra}]
    return doc


def test_discovery_settings_round_trip() -> None:
    doc = _discovered({"dns": "vllm.llm.svc.cluster.local", "port": 8000, "scheme": "https"})
    spec = parse_config(doc).backends[0]
    assert spec.discover == DnsDiscovery("vllm.llm.svc.cluster.local", 8000, "https", 10.0)
    assert spec.url == ""


def test_discovery_mistakes_are_reported_at_their_paths() -> None:
    assert "backends[0].discover.port" in _errors(_discovered({"dns": "vllm"}))
    assert "backends[0].discover.dns" in _errors(_discovered({"dns": "not a name", "port": 1}))
    both = _errors(_discovered({"dns": "vllm", "port": 1}, url="http://vllm:1"))
    assert "one of url, emulator or discover" in both["backends[0]"]
    plain = _discovered({"dns": "vllm", "port": 1}, tls={"verify": False})
    assert "https" in _errors(plain)["backends[0].tls"]
    interval = _discovered({"dns": "vllm", "port": 1, "interval_seconds": 0})
    assert "backends[0].discover.interval_seconds" in _errors(interval)
    at = base_config([("a@b", "vllm", "http://h:1")])
    assert "'@'" in _errors(at)["backends[0].name"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("https://user:pa55@engine.internal/base", "https://engine.internal/base"),
        ("http://token@[fd00::2]:8000/x?key=abc#frag", "http://[fd00::2]:8000/x"),
    ],
)
def test_a_url_in_a_log_line_has_no_credentials(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def _emulated(emulator: object) -> dict[str, Any]:
    doc = base_config([("p0", "vllm", "http://unused:1")])
    doc["backends"] = [{"name": "p0", "engine": "vllm", "emulator": emulator}]
    return doc


def test_an_emulator_block_sets_its_role_and_profile_keys() -> None:
    doc = _emulated({"profile": "vllm", "role": "prefill", "set": {"kv_hold_timeout_s": 2}})
    spec = parse_config(doc).backends[0].emulator
    assert spec is not None and spec.role == "prefill"
    argv = emulator_argv(spec, "127.0.0.1")
    assert argv[-4:] == ["--set", "kv_hold_timeout_s=2", "--set", "role=prefill"]
    errors = _errors(_emulated({"profile": "vllm", "role": "prefil", "set": {"k": [1]}}))
    assert "prefill" in errors["backends[0].emulator.role"]
    assert "backends[0].emulator.set.k" in errors

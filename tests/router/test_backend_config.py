"""A backend's ``tls`` section: parsed into UpstreamTls, its files loaded once, every
mistake reported at its path without the files' contents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from router.config.model import ConfigError, UpstreamTls
from router.config.parse import parse_config
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

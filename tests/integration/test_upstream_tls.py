"""Upstream TLS per backend over loopback: emulators serving HTTPS with certificates from a
throwaway CA (trustme), a router process in front with each backend's ``tls`` settings.

One HTTPS emulator is reached by three backends with different settings (the right CA, a
wrong CA, no client certificate for the mutual-TLS one), so this also shows that pooled
connections are never shared across TLS settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import trustme

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
SNI = "engine.internal"


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path
    server: tuple[Path, Path]
    """Certificate chain and key for 127.0.0.1 and localhost."""
    named: tuple[Path, Path]
    """Certificate chain and key for engine.internal only."""
    client: tuple[Path, Path]


def _write(directory: Path, name: str, cert: trustme.LeafCert) -> tuple[Path, Path]:
    chain, key = directory / f"{name}.pem", directory / f"{name}.key"
    chain.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return chain, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    return Pki(
        ca=d / "ca.pem",
        other_ca=d / "other-ca.pem",
        server=_write(d, "server", ca.issue_cert("127.0.0.1", "localhost")),
        named=_write(d, "named", ca.issue_cert(SNI)),
        client=_write(d, "client", ca.issue_cert("router.client")),
    )


def _https_emulator(cert: tuple[Path, Path], *extra: str) -> Any:
    args = ["--ssl-certfile", str(cert[0]), "--ssl-keyfile", str(cert[1]), *extra]
    return start_emulator("vllm", time_scale=50, args=args)


@pytest.fixture(scope="module")
def emulators(pki: Pki) -> Iterator[dict[str, Process]]:
    mutual = ["--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2"]
    with (
        _https_emulator(pki.server) as tls,
        _https_emulator(pki.server, *mutual) as mtls,
        _https_emulator(pki.named) as named,
    ):
        yield {"tls": tls, "mtls": mtls, "named": named}


def _config(backends: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    doc = base_config([(name, "vllm", url) for name, url, _ in backends])
    for entry, (_, _, tls) in zip(doc["backends"], backends, strict=True):
        entry["tls"] = tls
    doc["default_policy"] = "round-robin"
    return doc


def _chat(router: Process, policy: str) -> str:
    client = client_for(router.url, **{"X-Turnout-Policy": policy})
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        stream=True,
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_ca_bundle_client_certificate_and_server_name(
    pki: Pki, emulators: dict[str, Process], tmp_path: Path
) -> None:
    ca = {"ca_file": str(pki.ca)}
    client = {"cert_file": str(pki.client[0]), "key_file": str(pki.client[1])}
    doc = _config(
        [
            ("tls", emulators["tls"].url, ca),
            ("mtls", emulators["mtls"].url, {**ca, **client}),
            # The certificate names engine.internal only: the URL's address would not match.
            ("named", emulators["named"].url, {**ca, "server_name": SNI}),
            ("wrong_ca", emulators["tls"].url, {"ca_file": str(pki.other_ca)}),
            ("no_cert", emulators["mtls"].url, ca),
            ("insecure", emulators["named"].url, {"verify": False}),  # any certificate
            ("disc", "", ca),
        ]
    )
    # Discovered over https: the replica at 127.0.0.1 is checked against the DNS name.
    port = int(emulators["tls"].url.rsplit(":", 1)[1])
    disc = doc["backends"][-1]
    del disc["url"]
    disc["discover"] = {"dns": "localhost", "port": port, "scheme": "https"}
    with start_router(write_config(tmp_path, doc)) as router:
        health = {b["name"]: b["healthy"] for b in get(router.url + "/turnout/backends").json()}
        health.pop("disc@::1", None)  # where localhost has an IPv6 address too (nothing there)
        assert health == {
            "tls": True,
            "mtls": True,
            "named": True,
            "wrong_ca": False,
            "no_cert": False,
            "insecure": True,
            "disc@127.0.0.1": True,
        }
        for name in ("tls", "mtls", "named", "insecure", "disc"):
            assert _chat(router, f"{name}-only"), name
        # Not offered while its probes fail: a clear 503 in OpenAI's shape.
        with pytest.raises(openai.APIStatusError) as caught:
            _chat(router, "wrong_ca-only")
        assert caught.value.status_code == 503
        assert caught.value.body["code"] == "no_backend"  # type: ignore[index]


def test_failed_handshakes_give_a_502_that_names_no_certificate(
    pki: Pki, emulators: dict[str, Process], tmp_path: Path
) -> None:
    """Every backend fails its TLS handshake: tried anyway (panic mode), then a 502.

    A refused client certificate reaches the client side only as the server closing the
    connection (TLS 1.3 checks it after the client's handshake is done), so only the
    certificate checks the router makes itself name TLS in the message.
    """
    doc = _config(
        [
            ("wrong_ca", emulators["tls"].url, {"ca_file": str(pki.other_ca)}),
            ("no_cert", emulators["mtls"].url, {"ca_file": str(pki.ca)}),
            ("wrong_name", emulators["named"].url, {"ca_file": str(pki.ca)}),
        ]
    )
    with start_router(write_config(tmp_path, doc)) as router:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for policy in ("wrong_ca-only", "no_cert-only", "wrong_name-only"):
            reply = post(router.url + "/v1/chat/completions", body, {"X-Turnout-Policy": policy})
            assert reply.status == 502, reply.text
            error = reply.json()["error"]
            assert error["code"] == "upstream_unreachable"
            if policy != "no_cert-only":
                assert "TLS: CERTIFICATE_VERIFY_FAILED" in error["message"], error["message"]
            for secret in (str(pki.ca.parent), SNI, "BEGIN", "trustme", "127.0.0.1"):
                assert secret not in reply.text

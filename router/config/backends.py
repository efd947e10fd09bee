"""The ``backends`` section: each entry's URL or emulator, TLS settings and header list; and
``pricing``, what each backend costs an hour (read by replay's cost figures, nothing else).

Also the one place a backend's TLS settings become an :class:`ssl.SSLContext`
(:func:`client_tls`): the parser builds it once to check the files, and every client that
talks to the backend (proxied requests, probes, scrapes, mirrors) uses the same one.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from router.config.model import (
    ROUTER_HEADERS,
    BackendSpec,
    DnsDiscovery,
    EmulatorSpec,
    UpstreamTls,
)
from turnout.common.schema import Reader, join, unknown


def read_backends(top: Reader) -> tuple[BackendSpec, ...]:
    """Every ``backends`` entry (with fallbacks for wrong values; errors to ``top.errors``)."""
    out: list[BackendSpec] = []
    seen: set[str] = set()
    for path, item in top.entries("backends", required=True, non_empty=True):
        m = Reader.of(item, path, top.errors, required=True)
        name = m.string("name", "", required=True)
        if name in seen:
            m.error("name", f"duplicate backend name {name!r}")
        seen.add(name)
        if "@" in name:  # it separates a discovered replica's address (policies.types.group_of)
            m.error("name", "cannot contain '@'")
        url = m.string("url", "")
        emulator = _emulator(m.child("emulator")) if m.raw_value("emulator") is not None else None
        discover = _discover(m.child("discover")) if m.raw_value("discover") is not None else None
        given = [k for k, v in (("url", url), ("emulator", emulator), ("discover", discover)) if v]
        if len(given) > 1:
            m.error(None, "give one of url, emulator or discover")
        elif not given and not m.has("url") and m.raw:
            m.error("url", "is required (or give emulator or discover)")
        elif url and not _http_url(url):
            m.error("url", "expected an http(s) URL with a host")
        elif url and (doubled := _doubled_v1(url)) is not None:
            m.error("url", f"ends in /v1, which the router adds itself: it would call "
                    f"{doubled}/chat/completions; drop the /v1")  # fmt: skip
        tls = _tls(m.child("tls")) if m.raw_value("tls") is not None else None
        if tls is not None:
            https = discover.scheme == "https" if discover is not None else url.startswith("https:")
            if not https:
                m.error("tls", "applies to an https backend only")
            else:
                _check_files(m, tls)
        out.append(
            BackendSpec(
                name=name,
                engine=m.string("engine", "", required=True),
                url=url.rstrip("/"),
                models=tuple(m.string_list("models") or ()),
                api_key_env=m.string("api_key_env"),
                max_inflight=m.integer("max_inflight", None, low=1),
                priority_capable=m.flag("priority_capable", False),
                emulator=emulator,
                forward_headers=_forward_headers(m),
                tls=tls,
                discover=discover,
            )
        )
        m.done()
    return tuple(out)


def read_pricing(m: Reader, backends: list[str]) -> dict[str, float]:
    """``pricing: {BACKEND: {usd_per_hour: X}}`` -> backend name -> USD an hour."""
    out = {}
    for name in m.names():
        if name not in backends:
            m.error(name, unknown(name, backends, "backend"))
        e = m.child(name, required=True)
        out[name] = e.number("usd_per_hour", 0.0, low=0.0)
        if not e.has("usd_per_hour") and e.raw:
            e.error("usd_per_hour", "is required")
        e.done()
    m.done()
    return out


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110 5.1)


def _forward_headers(m: Reader) -> tuple[str, ...]:
    out = []
    for i, name in enumerate(m.string_list("forward_headers") or ()):
        if not _TOKEN.fullmatch(name):
            m.error(join("forward_headers", i), "expected a header name")
        elif name.lower() in ROUTER_HEADERS:
            m.error(join("forward_headers", i), "a header the router sets or drops itself")
        else:
            out.append(name.lower())
    return tuple(out)


def shown_url(url: str) -> str:
    """``url`` as a log line may show it: without credentials (``user:password@``), query
    or fragment, any of which may carry a secret."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _http_url(url: str) -> bool:
    try:  # urlsplit and .port raise ValueError for a bracketed host or a port out of range
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:
        return False


def _doubled_v1(url: str) -> str | None:
    """The path a request would go to when ``url`` already ends in ``/v1`` (the router
    appends ``/v1/...`` to the base URL), else None; only the path is shown, not the host."""
    path = urlsplit(url).path.rstrip("/")
    return f"{path}/v1" if path.lower().endswith("/v1") else None


_ROLES = ("both", "prefill", "decode")  # the emulator's, which the router does not import


def _emulator(m: Reader) -> EmulatorSpec:
    sets = m.child("set")
    overrides: list[tuple[str, str | int | float | bool]] = []
    for key in sets.names():
        value = sets.raw[key]
        if isinstance(value, str | int | float | bool):
            overrides.append((key, value))
        else:
            sets.error(key, "expected a string, number or boolean")
    out = EmulatorSpec(
        profile=m.string("profile", "", required=True),
        time_scale=m.number("time_scale", 1.0, low=1e-6),
        seed=m.integer("seed", 0, low=None),
        model=m.string("model"),
        role=m.choice("role", _ROLES, "both"),
        overrides=tuple(overrides),
    )
    m.done()
    return out


_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?")


def _discover(m: Reader) -> DnsDiscovery:
    dns = m.string("dns", "", required=True)
    if dns and not _HOST.fullmatch(dns):
        m.error("dns", "expected a DNS name")
    if not m.has("port"):
        m.error("port", "is required")
    out = DnsDiscovery(
        dns=dns,
        port=m.integer("port", 0, low=1, high=65535),
        scheme=m.choice("scheme", ("http", "https"), "http"),
        interval=m.number("interval_seconds", 10.0, low=0.1),
    )
    m.done()
    return out


def _tls(m: Reader) -> UpstreamTls:
    out = UpstreamTls(
        ca_file=m.string("ca_file"),
        cert_file=m.string("cert_file"),
        key_file=m.string("key_file"),
        server_name=m.string("server_name"),
        verify=m.flag("verify", True),
    )
    if (out.cert_file is None) != (out.key_file is None):
        m.error(None, "give cert_file and key_file together (a client certificate and its key)")
    if not out.verify and (out.ca_file is not None or out.server_name is not None):
        m.error("verify", "ca_file and server_name do nothing with verify: false")
    m.done()
    return out


def _check_files(m: Reader, tls: UpstreamTls) -> None:
    """Load the files once now, so a wrong path or a bad PEM file fails the config."""
    try:
        _context(tls)
    except TlsFileError as exc:
        m.error(join("tls", exc.key), exc.message)


class TlsFileError(ValueError):
    """A TLS file that cannot be used; ``key`` names its setting."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True, slots=True, eq=False)
class ClientTls:
    """The client side of TLS to one backend. Compared by identity: connection pools key
    their idle connections by it, so two backends on one address never share one."""

    context: ssl.SSLContext
    server_name: str | None
    """SNI and certificate name; None: the URL's host."""


def client_tls(spec: BackendSpec) -> ClientTls | None:
    """``spec``'s TLS client side (files read now); None for an ``http`` backend.

    Raises :class:`TlsFileError` when a file cannot be loaded (the parser checked them, but
    they may have changed since).
    """
    if not spec.url.startswith("https://"):
        return None
    tls = spec.tls or UpstreamTls()
    return ClientTls(_context(tls), tls.server_name)


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal of a server.
    raise TlsFileError("key_file", "the key is encrypted (give an unencrypted PEM key)")


def _context(tls: UpstreamTls) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except OSError as exc:  # ssl.SSLError too: its reason names the PEM problem
            reason = getattr(exc, "reason", None) or exc.strerror or "not PEM certificates"
            raise TlsFileError("ca_file", f"cannot load {tls.ca_file}: {reason}") from None
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file, password=_no_password)
        except ssl.SSLError:
            message = "not a PEM certificate and its matching PEM key"
            message = f"{tls.cert_file} with {tls.key_file}: {message}"
            raise TlsFileError("cert_file", message) from None
        except OSError as exc:
            message = f"cannot read {tls.cert_file} or {tls.key_file}: {exc.strerror}"
            raise TlsFileError("cert_file", message) from None
    return context

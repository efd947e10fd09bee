"""Where a backend listens, and the head of a request sent there (router.proxy.connection)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from yarl import URL


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a backend listens: scheme, host and port (one connection pool each)."""

    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str]:
    """``http://host:port/prefix/v1/x?q`` -> (origin, ``/prefix/v1/x?q``); parsed once per URL."""
    u = URL(url)
    if u.scheme not in ("http", "https") or not u.host or u.port is None:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return Origin(u.scheme, u.host, u.port), u.raw_path_qs


def request_head(origin: Origin, path: str, headers: dict[str, str], length: int) -> bytes:
    """A POST request's head, refusing header text that would split it."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {origin.host_header}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    lines.append(f"Content-Length: {length}")
    text = "\r\n".join(lines) + "\r\n\r\n"
    # Exactly one CR and one LF per line: a stray one would smuggle a header or a request.
    if text.count("\n") != len(lines) + 1 or text.count("\r") != len(lines) + 1:
        raise ValueError("a header name or value contains CR or LF")
    return text.encode("utf-8", "surrogateescape")

"""Header hygiene both ways: what a backend gets of the client's headers, and what the client
gets of the backend's."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from multidict import CIMultiDict

# The client headers an engine gets without the config naming them: content negotiation,
# trace context and the client's name. Everything else stays with the router unless the
# backend's ``forward_headers`` lists it: headers that steer an engine's internals (the
# emulator's X-Emulator-Fault) and credentials meant for the router or someone else
# (X-Api-Key, api-key, Cookie, Proxy-Authorization). The router sets Content-Type,
# X-Request-Id and the backend's own Authorization itself, and Accept-Encoding: identity
# (without it, any encoding is acceptable: RFC 9110 12.5.3), since it meters the bytes it
# forwards and so takes them uncompressed (see router.proxy.upstream._unservable).
_FORWARD = frozenset({"accept", "accept-language", "user-agent", "traceparent", "tracestate",
                      "baggage"})  # fmt: skip
_DROP_DOWNSTREAM = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",  # only identity is relayed (router.proxy.upstream): no news
        "date",
        "server",
        "x-request-id",
        # The backend's own side: its cookies and auth challenges, the proxies it sits behind,
        # its software. None of it is the client's, and it may name internal hosts.
        "set-cookie",
        "set-cookie2",
        "www-authenticate",
        "via",
        "x-powered-by",
        "x-served-by",
        "x-backend-server",
        "x-runtime",
        "x-aspnet-version",
        "alt-svc",
        "nel",
        "report-to",
        "reporting-endpoints",
    }
)
# Prefixes of what proxies and load balancers in front of an engine add.
_DROP_DOWNSTREAM_PREFIXES = ("x-upstream-", "x-envoy-", "x-forwarded-", "x-real-", "x-amz")


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    """Headers named in ``Connection`` are hop-by-hop too (RFC 9110 7.6.1)."""
    value = headers.get("Connection") or headers.get("connection")
    if not value:
        return frozenset()
    return frozenset(t.strip().lower() for t in value.split(",") if t.strip())


def upstream_headers(
    client: Mapping[str, str],
    request_id: str,
    api_key: str | None,
    allowed: Collection[str] = (),
) -> dict[str, str]:
    """The headers sent to a backend: the client's that :data:`_FORWARD` or ``allowed``
    (lower-case names, from the config) let through, plus id, type and key."""
    hop = _connection_tokens(client)
    out = {
        k: v
        for k, v in client.items()
        if ((n := k.lower()) in _FORWARD or n in allowed) and n not in hop
    }
    out["X-Request-Id"] = request_id
    out["Content-Type"] = "application/json"
    out["Accept-Encoding"] = "identity"
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def downstream_headers(upstream: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream response's end-to-end headers, less the backend's infrastructure (see
    :data:`_DROP_DOWNSTREAM`), plus the router's own (which replace any of those names)."""
    named = _connection_tokens(upstream)
    drop = _DROP_DOWNSTREAM | named if named else _DROP_DOWNSTREAM  # no copy of the set if none
    own = {name.lower() for name in extra}
    out = CIMultiDict(extra)  # built once and added to: about half the cost of an update()
    for k, v in upstream.items():
        n = k.lower()
        if n not in drop and n not in own and not n.startswith(_DROP_DOWNSTREAM_PREFIXES):
            out.add(k, v)
    return out

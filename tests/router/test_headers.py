"""Header hygiene between client, router and backend."""

from __future__ import annotations

from multidict import CIMultiDict

from router.proxy.headers import downstream_headers, upstream_headers


def test_upstream_headers_pass_only_the_standard_ones_and_credentials_stay() -> None:
    client = CIMultiDict(
        {
            "Host": "router:8080",
            "Connection": "keep-alive, X-Trace-Hop",
            "X-Trace-Hop": "1",
            "Keep-Alive": "timeout=5",
            "Transfer-Encoding": "chunked",
            "Content-Length": "10",
            "Content-Type": "text/plain",
            "Content-Encoding": "gzip",
            "Authorization": "Bearer client-key",
            "Proxy-Authorization": "Basic eA==",
            "X-Api-Key": "other-key",
            "api-key": "azure-key",
            "Cookie": "a=b",
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "Expect": "100-continue",
            "X-Turnout-Policy": "p",
            "X-Request-Class": "batch",
            "X-Request-Id": "old",
            "User-Agent": "OpenAI/Python",
            "X-Stainless-Lang": "python",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "X-Emulator-Fault": "stall=1",
        }
    )
    out = upstream_headers(client, "rid", "backend-key")
    assert out == {
        "Accept": "application/json",
        "User-Agent": "OpenAI/Python",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "X-Request-Id": "rid",
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",  # the client's gzip is not the router's to take
        "Authorization": "Bearer backend-key",
    }
    assert "Authorization" not in upstream_headers(client, "rid", None)


def test_upstream_headers_pass_what_the_backend_allows() -> None:
    client = CIMultiDict({"X-Emulator-Fault": "status=500", "X-Api-Key": "k", "X-Other": "1"})
    out = upstream_headers(client, "rid", None, ("x-emulator-fault", "x-api-key"))
    assert out == {
        "X-Emulator-Fault": "status=500",
        "X-Api-Key": "k",
        "X-Request-Id": "rid",
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",
    }
    # Named in Connection: hop-by-hop, even when allowed.
    hop = CIMultiDict({"Connection": "x-api-key", "X-Api-Key": "k"})
    assert "X-Api-Key" not in upstream_headers(hop, "rid", None, ("x-api-key",))


def test_downstream_headers_keep_end_to_end_and_add_router_headers() -> None:
    upstream = CIMultiDict(
        {
            "Content-Type": "text/event-stream",
            "Transfer-Encoding": "chunked",
            "Content-Length": "5",
            "Connection": "close",
            "Date": "x",
            "Server": "uvicorn",
            "X-Request-Id": "engine-id",
            "Cache-Control": "no-cache",
        }
    )
    out = downstream_headers(upstream, {"X-Request-Id": "rid", "X-Turnout-Backend": "b"})
    assert dict(out) == {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Request-Id": "rid",
        "X-Turnout-Backend": "b",
    }

"""Header hygiene between client, router and backend."""

from __future__ import annotations

from multidict import CIMultiDict

from router.proxy.upstream import downstream_headers, upstream_headers


def test_upstream_headers_strip_hop_by_hop_and_credentials() -> None:
    client = CIMultiDict(
        {
            "Host": "router:8080",
            "Connection": "keep-alive, X-Trace-Hop",
            "X-Trace-Hop": "1",
            "Keep-Alive": "timeout=5",
            "Transfer-Encoding": "chunked",
            "Content-Length": "10",
            "Authorization": "Bearer client-key",
            "Cookie": "a=b",
            "Accept-Encoding": "gzip",
            "Expect": "100-continue",
            "X-Switchyard-Policy": "p",
            "X-Request-Class": "batch",
            "X-Request-Id": "old",
            "User-Agent": "OpenAI/Python",
            "X-Emulator-Fault": "stall=1",
        }
    )
    out = upstream_headers(client, "rid", "backend-key")
    assert out == {
        "User-Agent": "OpenAI/Python",
        "X-Emulator-Fault": "stall=1",
        "X-Request-Id": "rid",
        "Content-Type": "application/json",
        "Authorization": "Bearer backend-key",
    }
    assert "Authorization" not in upstream_headers(client, "rid", None)


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
    out = downstream_headers(upstream, {"X-Request-Id": "rid", "X-Switchyard-Backend": "b"})
    assert dict(out) == {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Request-Id": "rid",
        "X-Switchyard-Backend": "b",
    }

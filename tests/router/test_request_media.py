"""What a client's request may carry to an engine, in-process against a fake engine.

A body is JSON (or undeclared) in an encoding the router decodes, else 415; the engine gets
the decoded body without the encoding, and of the client's headers only the standard ones
and those its backend's ``forward_headers`` lists: no other credential, no engine knob.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.router.fake_upstream import MODEL, InProcess, in_process_router
from tests.router.harness import base_config

CHAT = [{"role": "user", "content": "hello"}]
BODY = orjson.dumps({"model": MODEL, "messages": CHAT})


def config(**backend: Any) -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")])
    doc["backends"][0].update(backend)
    doc["health"]["scrape_metrics"] = False
    return doc


async def send(
    ip: InProcess, body: bytes, headers: dict[str, str], skip: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(skip_auto_headers=skip) as session,
        session.post(f"{ip.url}/v1/chat/completions", data=body, headers=headers) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize(
    ("encoding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
async def test_an_encoded_body_is_decoded_and_sent_on_without_its_encoding(
    tmp_path: Path, encoding: str, encode: Any
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        status, doc = await send(ip, encode(BODY), headers)
        assert status == 200, doc
        assert ip.engine.bodies[-1]["messages"] == CHAT
        assert "content-encoding" not in {k.lower() for k in ip.engine.headers[-1]}


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {"Content-Type": "application/json", "Content-Encoding": "compress"},
        {"Content-Type": "application/json", "Content-Encoding": "gzip, identity"},
    ],
)
async def test_a_body_not_declared_json_or_not_decodable_is_415(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        status, doc = await send(ip, BODY, headers)
        assert status == 415
        assert doc["error"]["code"] == "unsupported_media_type"
        assert doc["error"]["type"] == "invalid_request_error"
        assert ip.engine.bodies == []


@pytest.mark.parametrize(
    ("headers", "skip"),
    [
        ({}, ("Content-Type",)),  # no Content-Type at all
        ({}, ()),  # aiohttp's application/octet-stream for bytes of no declared type
        ({"Content-Type": "application/json; charset=utf-8"}, ()),
        ({"Content-Type": "Application/JSON", "Content-Encoding": "identity"}, ()),
    ],
)
async def test_a_json_body_without_a_declared_type_is_served(
    tmp_path: Path, headers: dict[str, str], skip: tuple[str, ...]
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        status, doc = await send(ip, BODY, headers, skip)
        assert status == 200, doc


CLIENT_HEADERS = {
    "Content-Type": "application/json",
    "User-Agent": "OpenAI/Python 1.0",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "Authorization": "Bearer client-key",
    "X-Api-Key": "other-key",
    "api-key": "azure-key",
    "Cookie": "session=1",
    "X-Emulator-Fault": "status=500",
    "X-Stainless-Lang": "python",
}


async def test_only_standard_headers_reach_the_engine(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config(api_key_env="NO_SUCH_ENV_VAR")) as ip:
        status, doc = await send(ip, BODY, CLIENT_HEADERS)
        assert status == 200, doc
        got = {k.lower(): v for k, v in ip.engine.headers[-1].items()}
    assert got["user-agent"] == "OpenAI/Python 1.0"
    assert got["traceparent"] == CLIENT_HEADERS["traceparent"]
    assert got["content-type"] == "application/json"
    for name in ("authorization", "x-api-key", "api-key", "cookie", "x-emulator-fault",
                 "x-stainless-lang"):  # fmt: skip
        assert name not in got


async def test_a_backend_gets_the_headers_its_config_allows(tmp_path: Path) -> None:
    allowed = config(forward_headers=["X-Emulator-Fault", "x-api-key"])
    async with in_process_router(tmp_path, allowed) as ip:
        status, doc = await send(ip, BODY, CLIENT_HEADERS)
        assert status == 200, doc
        got = {k.lower(): v for k, v in ip.engine.headers[-1].items()}
    assert got["x-emulator-fault"] == "status=500" and got["x-api-key"] == "other-key"
    assert "api-key" not in got and "cookie" not in got

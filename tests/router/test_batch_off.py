"""Without ``batch:`` in the config, the Batch API's routes say it is off and how to turn
it on, in OpenAI's error shape (the official client raises NotFoundError), not "no route"."""

from __future__ import annotations

import io
from collections.abc import Awaitable
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.router.fake_upstream import in_process_router
from tests.router.test_handler import config


async def test_the_batch_api_answers_that_it_is_off(tmp_path: Path) -> None:
    async with (
        in_process_router(tmp_path, config()) as ip,
        openai.AsyncOpenAI(base_url=ip.url + "/v1", api_key="x", max_retries=0) as client,
    ):
        calls: list[Awaitable[object]] = [
            client.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch"),
            client.files.list(),
            client.files.delete("file-1"),
            client.batches.retrieve("batch_1"),
            client.batches.cancel("batch_1"),
        ]
        for call in calls:
            with pytest.raises(openai.NotFoundError) as exc:
                await call
            error = exc.value.body
            assert isinstance(error, dict) and error["code"] == "batch_api_off", error
            assert "'batch:' section" in error["message"]
        async with aiohttp.ClientSession() as session, session.get(ip.url + "/v1/nope") as resp:
            assert resp.status == 404 and "no route" in (await resp.json())["error"]["message"]

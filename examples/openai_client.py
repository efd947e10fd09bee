"""Talk to Turnout with the official OpenAI client: nothing but ``base_url`` changes.

    python examples/openai_client.py [--base-url http://127.0.0.1:8080/v1] [--requests 6]

Sends a mix of the two request classes the router tells apart and prints, for each request,
where it went (the ``X-Turnout-*`` response headers) and how it was answered:

- interactive: streamed chats (the router measures TTFT from the stream);
- batch: non-streamed requests with ``service_tier="flex"`` (OpenAI's own way to say
  "cheaper, slower is fine"; the router's default config classifies them as batch);
- one request that names its class and policy in headers (``X-Request-Class``,
  ``X-Turnout-Policy``), as a replay or a canary client would;
- one streamed request to the Responses API (``client.responses.create``), the API new
  applications are written against: routed and measured like a chat.
"""

from __future__ import annotations

import argparse
import sys
import time

from openai import OpenAI

PROMPTS = (
    "Explain continuous batching in one sentence.",
    "Write a haiku about a railway turnout.",
    "Name three reasons to stream LLM responses.",
)


def show(kind: str, headers: dict[str, str], text: str, seconds: float) -> None:
    route = (
        f"backend={headers.get('x-turnout-backend')} "
        f"policy={headers.get('x-turnout-policy')} class={headers.get('x-turnout-class')}"
    )
    print(f"{kind:11} {route:50} {seconds * 1000:7.0f} ms  {text[:40]!r}")


def interactive(client: OpenAI, model: str, prompt: str) -> None:
    """A streamed chat; usage is asked for so the last chunk carries the token counts."""
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    show("interactive", dict(raw.headers), text, time.perf_counter() - start)


def batch(client: OpenAI, model: str, prompt: str) -> None:
    """A non-streamed request that does not mind waiting: service_tier flex means batch."""
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=64,
        service_tier="flex",
    )
    text = raw.parse().choices[0].message.content or ""
    show("batch", dict(raw.headers), text, time.perf_counter() - start)


def pinned(client: OpenAI, model: str, policy: str) -> None:
    """Class and policy stated in headers (the policy header works when the config allows)."""
    start = time.perf_counter()
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=8,
        extra_headers={"X-Request-Class": "interactive", "X-Turnout-Policy": policy},
    )
    show("headers", dict(raw.headers), raw.parse().choices[0].text, time.perf_counter() - start)


def responses(client: OpenAI, model: str, prompt: str) -> None:
    """A streamed Responses API request: typed events, the text in its deltas, the usage in
    ``response.completed``."""
    start = time.perf_counter()
    raw = client.responses.with_raw_response.create(
        model=model,
        instructions="Answer in one sentence.",
        input=prompt,
        max_output_tokens=32,
        stream=True,
    )
    text, tokens = "", None
    for event in raw.parse():
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.completed" and event.response.usage is not None:
            tokens = event.response.usage.output_tokens
    show("responses", dict(raw.headers), f"{tokens} tokens: {text}", time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--api-key", default="unused", help="a client key, if the router needs one")
    p.add_argument("--model", help="default: the first model the router lists")
    p.add_argument("--requests", type=int, default=6, help="interactive + batch requests")
    p.add_argument("--policy", default="round-robin", help="policy for the header example")
    args = p.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = client.models.retrieve(args.model).id if args.model else client.models.list().data[0].id
    print(f"model {model} at {args.base_url}")
    for i in range(args.requests):
        send = interactive if i % 3 != 2 else batch  # two interactive for one batch
        send(client, model, PROMPTS[i % len(PROMPTS)])
    pinned(client, model, args.policy)
    responses(client, model, PROMPTS[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())

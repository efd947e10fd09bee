"""What the stream meter costs per event: chat chunks against the Responses API's typed events.

The router feeds every upstream chunk through :class:`turnout.common.sse.StreamMeter` (with
``track_gaps=False``, as router.proxy.handler does). A typed event is an ``event:`` line plus
one ``data:`` line; the meter reads it on a shortcut rather than its general field parser.
This feeds one event per chunk, as an engine sends them, for a chat stream, a Responses API
stream, and the same Responses stream with CRLF line endings (which the shortcut does not
take, so it shows what the general path would cost), and prints nanoseconds per event,
best of ``--rounds``, side by side.

    python -m benchmarks.meter_cost [--tokens 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import time

import orjson

from turnout.common.sse import StreamMeter


def chat_stream(tokens: int) -> list[bytes]:
    """A vLLM-shaped chat stream: role chunk, ``tokens`` content chunks, finish, usage."""
    meta = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**meta, "choices": [choice]}) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": " word"}) for _ in range(tokens)]
    out.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}
    out.append(b"data: " + orjson.dumps({**meta, "choices": [], "usage": usage}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def responses_stream(tokens: int) -> list[bytes]:
    """A vLLM-shaped Responses API stream of ``tokens`` text deltas."""
    seq = iter(range(tokens + 16))

    def event(kind: str, **fields: object) -> bytes:
        doc = orjson.dumps({"type": kind, "sequence_number": next(seq), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + doc + b"\n\n"

    started = {"id": "resp_1", "object": "response", "status": "in_progress", "usage": None}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    out = [
        event("response.created", response=started),
        event("response.in_progress", response=started),
        event("response.output_item.added", output_index=0, item={"id": "msg_1", "content": []}),
        event("response.content_part.added", **where, part={"type": "output_text", "text": ""}),
    ]
    out += [
        event("response.output_text.delta", **where, delta=" word", logprobs=[])
        for _ in range(tokens)
    ]
    text = " word" * tokens
    out.append(event("response.output_text.done", **where, text=text, logprobs=[]))
    usage = {"input_tokens": 9, "output_tokens": tokens, "total_tokens": 9 + tokens}
    done = {**started, "status": "completed", "usage": usage}
    out.append(event("response.completed", response=done))
    return out


def per_event_ns(events: list[bytes], rounds: int) -> float:
    """Best-of-``rounds`` nanoseconds per event for one meter fed one event per chunk."""
    best = float("inf")
    for _ in range(rounds):
        meter = StreamMeter(0.0, track_gaps=False)
        t0 = time.perf_counter_ns()
        for e in events:
            meter.feed(e, 1.0)
        best = min(best, (time.perf_counter_ns() - t0) / len(events))
        assert meter.done and meter.completion_tokens is not None
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    typed = responses_stream(a.tokens)
    rows = [
        ("chat chunks (data: only)", chat_stream(a.tokens)),
        ("responses, typed events", typed),
        ("responses, CRLF (general path)", [e.replace(b"\n", b"\r\n") for e in typed]),
    ]
    print(f"{'stream':<32} {'events':>7} {'ns/event':>9}")
    for name, events in rows:
        print(f"{name:<32} {len(events):>7} {per_event_ns(events, a.rounds):>9.0f}")


if __name__ == "__main__":
    main()

"""Checking a batch's input file: OpenAI Batch lines, one JSON object a line.

A line is ``{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>, "body": {...}}``.
Any bad line fails the whole batch (as OpenAI's does) with every problem found, each naming
its line; the errors listed are capped so that a file of garbage cannot fill the database.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from router.batch.store import NewLine

MAX_REPORTED = 100
"""Validation errors kept for one batch (the rest are counted in the last one's message)."""


@dataclass(frozen=True, slots=True)
class LineError:
    """One problem with the input file, in the shape of a Batch's ``errors.data`` entry."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def parse_input(
    content: bytes, endpoint: str, max_lines: int
) -> tuple[list[NewLine], list[LineError]]:
    """The file's lines for a batch to ``endpoint``, or the errors that fail it."""
    lines: list[NewLine] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    number = 0
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            errors.append(LineError("too_many_lines", f"a batch holds at most {max_lines} lines"))
            break
        line, problem = _line(raw, endpoint, seen)
        if problem is not None:
            errors.append(LineError(problem[0], problem[1], number, problem[2]))
        elif line is not None:
            lines.append(line)
    if not lines and not errors:
        errors.append(LineError("empty_file", "the input file holds no request lines"))
    if len(errors) > MAX_REPORTED:
        more = len(errors) - MAX_REPORTED + 1
        last = errors[MAX_REPORTED - 1]
        errors[MAX_REPORTED - 1] = LineError(
            last.code, f"{last.message} (and {more - 1} more errors)", last.line, last.param
        )
        del errors[MAX_REPORTED:]
    return lines, errors


Problem = tuple[str, str, str | None]


def _line(raw: bytes, endpoint: str, seen: set[str]) -> tuple[NewLine | None, Problem | None]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, ("invalid_json_line", "the line is not valid JSON", None)
    if not isinstance(doc, dict):
        return None, ("invalid_json_line", "the line is not a JSON object", None)
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, ("missing_custom_id", "custom_id must be a non-empty string", "custom_id")
    if custom_id in seen:
        # The id itself is the client's data: not quoted back.
        return None, ("duplicate_custom_id", "custom_id is used by an earlier line", "custom_id")
    seen.add(custom_id)
    if doc.get("method") != "POST":
        return None, ("invalid_method", "method must be POST", "method")
    if doc.get("url") != endpoint:
        return None, ("invalid_url", f"url must be the batch's endpoint {endpoint}", "url")
    body = doc.get("body")
    if not isinstance(body, dict):
        return None, ("invalid_body", "body must be a JSON object", "body")
    if body.get("stream") is True:
        return None, ("invalid_body", "streaming is not supported in a batch", "body.stream")
    return NewLine(custom_id, endpoint, orjson.dumps(body)), None

"""Request sources: capture files and public trace formats, streamed line by line.

Every source yields :class:`Item`: a capture record to replay, plus (for imported traces and
``drop``-redacted captures) a :class:`Synth` saying which prompt to synthesize. No source
reads a whole file into memory. The format is detected from the first line's content.

BurstGPT rows with 0 response tokens are failed requests in the original trace: they are not
replayed (there is no output length to force) and are counted in :attr:`Source.skipped`.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from turnout.common.capture import CaptureFormatError, CaptureRecord, Response, record_from_dict

BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` block."""
_SESSIONS = 100_000
"""Open sessions a source keeps track of (least recently continued forgotten first)."""
SessionMode = Literal["auto", "infer", "off"]
"""Which rows form sessions: those that name one (``auto``), also Mooncake rows that extend
an earlier row's prompt (``infer``), none (``off``)."""
SESSION_MODES: tuple[SessionMode, ...] = ("auto", "infer", "off")
Format = Literal["capture", "mooncake", "azure", "burstgpt", "openai-batch"]
FORMATS: tuple[Format, ...] = ("capture", "mooncake", "azure", "burstgpt", "openai-batch")
CHAT_URL = "/v1/chat/completions"
RESPONSES_URL = "/v1/responses"
_PROMPT_KEYS = ("messages", "prompt", "input")


class SourceError(ValueError):
    """The file cannot be read as the requested or detected format."""


@dataclass(frozen=True, slots=True)
class Synth:
    """A prompt to synthesize: ``prompt_tokens`` long; ``hash_ids`` name shared prefix blocks."""

    prompt_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Item:
    """One request to replay: its row in the file, its record, and the prompt to synthesize."""

    row: int
    record: CaptureRecord
    synth: Synth | None = None
    session: str | None = None
    """The conversation it is a turn of (see :mod:`replay.sessions`), if any."""
    delay: float | None = None
    """Seconds to wait after the previous turn's answer (a Mooncake row's ``delay``)."""


def detect_format(path: str) -> Format:
    """Tell the format from the first non-empty line."""
    with open(path, "rb") as f:
        for raw in f:
            line = raw.strip()
            if line:
                return _detect_line(line, path)
    raise SourceError(f"{path}: empty file")


def _detect_line(line: bytes, path: str) -> Format:
    if line.startswith(b"{"):
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise SourceError(f"{path}: first line is not JSON") from None
        if "input_length" in doc and "timestamp" in doc:
            return "mooncake"
        if "custom_id" in doc and "body" in doc:
            return "capture" if "t_offset_ms" in doc or "v" in doc else "openai-batch"
        raise SourceError(f"{path}: JSON lines of an unknown shape (keys {sorted(doc)[:6]})")
    header = line.decode(errors="replace").lstrip("\ufeff").lower()
    if header.startswith("timestamp,contexttokens,generatedtokens"):
        return "azure"
    if "request tokens" in header and "response tokens" in header:
        return "burstgpt"
    raise SourceError(f"{path}: unknown format (first line {header[:60]!r})")


class Source:
    """Iterates the file's items; counts the rows it could not or would not replay."""

    def __init__(
        self,
        path: str,
        fmt: Format | None = None,
        *,
        model: str = "default",
        sessions: SessionMode = "auto",
    ) -> None:
        self.path = path
        self.format: Format = fmt or detect_format(path)
        if self.format not in FORMATS:
            raise SourceError(f"unknown format {self.format!r} (known: {', '.join(FORMATS)})")
        self.model = model
        self.skipped = 0
        self.errors: list[str] = []  # the first few, for the user
        self.sessions = sessions
        # Mooncake sessions: the last turn's time, and (inferring) each open session's last
        # turn by the prompt blocks a next turn would start with; both bounded (LRU).
        self._last: OrderedDict[str, float] = OrderedDict()
        self._tails: OrderedDict[tuple[int, ...], tuple[str, int, int]] = OrderedDict()

    def __iter__(self) -> Iterator[Item]:
        if self.format in ("capture", "openai-batch"):
            return self._jsonl(self._capture_line)
        if self.format == "mooncake":
            return self._jsonl(self._mooncake_line)
        return self._csv()

    def _skip(self, row: int, why: str) -> None:
        self.skipped += 1
        if len(self.errors) < 5:
            self.errors.append(f"{self.path}:{row + 1}: {why}")

    def _jsonl(self, parse: Callable[[int, Any], Item | None]) -> Iterator[Item]:
        with open(self.path, "rb") as f:
            for row, raw in enumerate(f):
                line = raw.strip()
                if not line:
                    continue
                try:
                    item = parse(row, orjson.loads(line))
                except (orjson.JSONDecodeError, CaptureFormatError, KeyError, TypeError) as e:
                    self._skip(row, str(e) or type(e).__name__)
                    continue
                if item is not None:
                    yield item

    def _capture_line(self, row: int, doc: Any) -> Item:
        if not isinstance(doc, dict):
            raise CaptureFormatError("expected a JSON object")
        rec = record_from_dict(doc)
        if self.format == "openai-batch":  # arrival times, if any, are not trusted: none given
            rec = dataclasses.replace(rec, t_offset_ms=None)
        synth = None
        if not any(k in rec.body for k in _PROMPT_KEYS):
            # a `drop`-redacted capture: the prompt's size survives in the usage
            size = rec.resp.prompt_tokens if rec.resp else None
            if size is None:
                raise CaptureFormatError("no prompt and no usage.prompt_tokens to size one")
            synth = Synth(size)
        session = None if self.sessions == "off" else rec.headers.get("x-session-id")
        return Item(row, rec, synth, session=session)

    def _mooncake_line(self, row: int, doc: Any) -> Item | None:
        hash_ids = tuple(int(h) for h in doc.get("hash_ids") or ())
        p, o = int(doc["input_length"]), int(doc["output_length"])
        session = doc.get("session_id")
        session = None if session is None or self.sessions == "off" else str(session)
        if session is None and self.sessions == "infer":
            session = self._infer(f"mooncake-{row}", hash_ids, p, o)
        delay = doc.get("delay")
        if "timestamp" in doc:
            t = float(doc["timestamp"])
        elif session is not None and session in self._last and delay is not None:
            t = self._last[session]  # a later turn timed by its delay alone
        else:
            raise KeyError("timestamp")
        if session is not None:
            _remember(self._last, session, t)
        item = self._imported(row, f"mooncake-{row}", t, p, o, hash_ids)
        if item is None or session is None:
            return item
        return dataclasses.replace(
            item, session=session, delay=None if delay is None else float(delay) / 1000.0
        )

    def _infer(self, own: str, hash_ids: tuple[int, ...], p: int, o: int) -> str:
        """The session a row continues: one whose last prompt's whole blocks it begins with
        and whose prompt and answer it holds; else a session of its own."""
        session = own
        for n in range(len(hash_ids), 0, -1):
            prev = self._tails.get(hash_ids[:n])
            if prev is not None and p >= prev[1] + prev[2]:
                session = prev[0]
                del self._tails[hash_ids[:n]]
                break
        whole = p // BLOCK_TOKENS
        if whole:
            _remember(self._tails, hash_ids[:whole], (session, p, o))
        return session

    def _imported(
        self,
        row: int,
        custom_id: str,
        t_offset_ms: float,
        prompt_tokens: object,
        output_tokens: object,
        hash_ids: tuple[int, ...] = (),
    ) -> Item | None:
        p, o = int(prompt_tokens), int(output_tokens)  # type: ignore[call-overload]
        if p < 1 or o < 0:
            raise TypeError(f"bad lengths {p}/{o}")
        if o == 0:  # a failed request in the original trace (see module doc)
            self._skip(row, "0 response tokens: a failed request in the trace, not replayed")
            return None
        body = forced_output_body(self.model, o)
        resp = Response(prompt_tokens=p, completion_tokens=o)
        rec = CaptureRecord(custom_id, CHAT_URL, body, t_offset_ms=t_offset_ms, resp=resp)
        return Item(row, rec, Synth(p, hash_ids))

    def _csv(self) -> Iterator[Item]:
        with open(self.path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                return
            t0: float | None = None
            for n, cols in enumerate(reader):
                row = n + 1
                if not cols:
                    continue
                try:
                    if self.format == "azure":
                        t = _azure_time(cols[0])
                        p, o = cols[1], cols[2]
                    else:
                        t, p, o = float(cols[0]), cols[2], cols[3]
                    t0 = t if t0 is None else t0
                    item = self._imported(
                        row, f"{self.format}-{n}", (t - t0) * 1000.0, p.strip(), o.strip()
                    )
                except (ValueError, IndexError, TypeError) as e:
                    self._skip(row, str(e))
                    continue
                if item is not None:
                    yield item


def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    if len(table) > _SESSIONS:
        table.popitem(last=False)


def forced_output_body(model: str, output_tokens: int) -> dict[str, Any]:
    """A streamed chat request whose output is forced to ``output_tokens`` tokens."""
    return {
        "model": model,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _azure_time(text: str) -> float:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` (no zone; 7 fractional digits) -> seconds."""
    whole, _, frac = text.strip().partition(".")
    if len(whole) != 19 or whole[10] != " ":
        raise ValueError(f"not YYYY-MM-DD HH:MM:SS: {whole!r}")
    base = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC)  # strptime is 10x slower
    return base.timestamp() + (float("0." + frac) if frac else 0.0)

"""The capture schema version ``v`` is checked when a line is read."""

from __future__ import annotations

import pytest

from turnout.common.capture import (
    SCHEMA_VERSION,
    CaptureFormatError,
    CaptureRecord,
    dump_line,
    parse_line,
)


def test_a_line_of_this_version_reads_back() -> None:
    line = dump_line(CaptureRecord("a", "/v1/completions", {"prompt": "x"}))
    assert parse_line(line).custom_id == "a"


def test_a_line_without_version_is_a_batch_line_of_version_one() -> None:
    assert parse_line(b'{"custom_id":"a","url":"/v1/x","body":{}}').custom_id == "a"


def test_a_newer_version_is_refused_with_its_number() -> None:
    newer = SCHEMA_VERSION + 1
    line = b'{"custom_id":"a","url":"/v1/x","body":{},"v":%d}' % newer
    with pytest.raises(CaptureFormatError, match=f"version {newer} is newer"):
        parse_line(line)


@pytest.mark.parametrize("v", [b'"1"', b"0", b"-2", b"true", b"1.5"])
def test_a_malformed_version_is_refused(v: bytes) -> None:
    with pytest.raises(CaptureFormatError, match=r"^v: "):
        parse_line(b'{"custom_id":"a","url":"/v1/x","body":{},"v":%b}' % v)

"""A batch's input lines checked as the file arrives in pieces (router.batch.validate).

However the file is cut into pieces, the lines and problems are the same as for the file
whole; a line longer than the body limit is one problem, found without holding it; errors
past the cap are counted, not kept.
"""

from __future__ import annotations

import json
import random

from router.batch.store import NewLine
from router.batch.validate import MAX_REPORTED, LineError, Validator

URL = "/v1/chat/completions"


def line(custom_id: str, **over: object) -> bytes:
    doc = {"custom_id": custom_id, "method": "POST", "url": URL, "body": {"model": "m"}, **over}
    return json.dumps(doc).encode()


def run(data: bytes, cuts: list[int], max_lines: int = 100, max_line: int = 1000) -> tuple[
    list[NewLine], list[LineError]
]:  # fmt: skip
    v = Validator(URL, max_lines, max_line)
    out: list[NewLine] = []
    start = 0
    for cut in [*cuts, len(data)]:
        out += v.feed(data[start:cut])
        start = cut
    out += v.finish()
    return out, v.errors


def test_pieces_cut_anywhere_give_what_the_whole_file_gives() -> None:
    rows = [line(f"c{i}") for i in range(20)]
    rows[7] = b"{not json"
    rows[12] = line("c3")  # a repeat
    rows[15] = line("c15", method="GET")
    data = b"\n".join(rows[:10]) + b"\n\n  \n" + b"\n".join(rows[10:])  # blank lines, no last \n
    whole = run(data, [])
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 30)))
        assert run(data, cuts) == whole
    lines, errors = whole
    # Lines come out until the first problem (the store drops those when the batch fails).
    assert [n.custom_id for n in lines] == [f"c{i}" for i in range(7)]
    assert [(e.code, e.line) for e in errors] == [
        ("invalid_json_line", 8), ("duplicate_custom_id", 15), ("invalid_method", 18),
    ]  # fmt: skip
    good, none = run(b"\n".join(line(f"g{i}") for i in range(5)) + b"\n", [3, 40, 41])
    assert [n.custom_id for n in good] == [f"g{i}" for i in range(5)] and none == []


def test_a_line_past_the_limit_is_one_problem_and_never_held() -> None:
    v = Validator(URL, 100, 1000)
    assert v.feed(line("a") + b"\n" + b"x" * 600) != []
    for _ in range(100):  # a 60 KB line in pieces: dropped as it comes
        v.feed(b"y" * 600)
        assert len(v._tail) <= 1000
    v.feed(b"\n" + line("b") + b"\n")
    v.finish()
    assert [(e.code, e.line) for e in v.errors] == [("line_too_large", 2)]
    assert v.count == 2  # a and b


def test_errors_past_the_cap_are_counted_and_too_many_lines_stops() -> None:
    _, errors = run(b"nope\n" * (MAX_REPORTED + 50), [])
    assert len(errors) == MAX_REPORTED
    assert errors[-1].message.endswith("(and 50 more errors)")
    v = Validator(URL, 3, 1000)
    assert len(v.feed(b"\n".join(line(f"c{i}") for i in range(10)))) == 3
    assert v.full and [e.code for e in v.errors] == ["too_many_lines"]
    _, empty = run(b"\n \n", [1])
    assert [e.code for e in empty] == ["empty_file"]

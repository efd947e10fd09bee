"""Just enough PromQL reading to check queries against a live /metrics: which series names a
query selects, which labels it matches on or groups by, and which ``le`` buckets it names."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"\b(turnout_[A-Za-z0-9_]+)\b")
_SELECTOR = re.compile(r"\b(turnout_[A-Za-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"([^\"]*)\"")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Query:
    """What one expression refers to."""

    names: frozenset[str]
    matchers: tuple[tuple[str, str, str], ...]  # (series name, label, value)
    grouping: frozenset[str]


def read_query(expr: str) -> Query:
    matchers = tuple(
        (name, label, value)
        for name, body in _SELECTOR.findall(expr)
        for label, value in _MATCHER.findall(body)
    )
    grouping = frozenset(
        label.strip() for group in _GROUPING.findall(expr) for label in group.split(",")
    )
    return Query(frozenset(_NAME.findall(expr)), matchers, grouping - {""})

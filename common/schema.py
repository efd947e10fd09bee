"""A small typed reader over parsed YAML that collects errors with their key paths."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

D = TypeVar("D")
C = TypeVar("C", bound=str)


def join(path: str, key: object) -> str:
    """``path.key`` (or ``key`` at the top level)."""
    return f"{path}.{key}" if path else str(key)


class Reader:
    """Reads values out of YAML mappings; every problem goes to :attr:`errors`, never raises."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append((path, message))

    def mapping(
        self, v: object, path: str, known: Iterable[str] | None, *, optional: bool = False
    ) -> dict[str, Any]:
        """``v`` as a dict with string keys; keys outside ``known`` are reported."""
        if v is None:
            if not optional:
                self.add(path, "missing")
            return {}
        if not isinstance(v, dict):
            self.add(path, f"expected a mapping, got {_kind(v)}")
            return {}
        allowed = None if known is None else list(known)
        out: dict[str, Any] = {}
        for k, val in v.items():
            if allowed is not None and k not in allowed:
                self.add(join(path, k), f"unknown key (known: {', '.join(allowed)})")
                continue
            out[str(k)] = val
        return out

    def sequence(self, v: object, path: str, *, required: bool = False) -> list[object]:
        if v is None:
            if required:
                self.add(path, "missing")
            return []
        if not isinstance(v, list):
            self.add(path, f"expected a list, got {_kind(v)}")
            return []
        return v

    def _get(self, m: Mapping[str, object], key: str, path: str, required: bool) -> object:
        v = m.get(key)
        if v is None and required:
            self.add(join(path, key), "missing")
        return v

    def string(
        self, m: Mapping[str, object], key: str, path: str, default: D, *, required: bool = False
    ) -> str | D:
        v = self._get(m, key, path, required)
        if v is None:
            return default
        if not isinstance(v, str) or not v:
            self.add(join(path, key), f"expected a non-empty string, got {_kind(v)}")
            return default
        return v

    def strings(
        self, m: Mapping[str, object], key: str, path: str, default: tuple[str, ...] = ()
    ) -> tuple[str, ...]:
        v = m.get(key)
        if v is None:
            return default
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            self.add(join(path, key), "expected a list of non-empty strings")
            return default
        return tuple(v)

    def boolean(
        self, m: Mapping[str, object], key: str, path: str, default: D, *, required: bool = False
    ) -> bool | D:
        v = self._get(m, key, path, required)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.add(join(path, key), f"expected true or false, got {_kind(v)}")
            return default
        return v

    def integer(
        self,
        m: Mapping[str, object],
        key: str,
        path: str,
        default: D,
        *,
        lo: int | None = None,
        hi: int | None = None,
    ) -> int | D:
        v = m.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            self.add(join(path, key), f"expected an integer, got {_kind(v)}")
            return default
        if not _in_range(v, lo, hi):
            self.add(join(path, key), f"{v} is out of range{_range(lo, hi)}")
            return default
        return v

    def number(
        self,
        m: Mapping[str, object],
        key: str,
        path: str,
        default: D,
        *,
        lo: float | None = None,
        hi: float | None = None,
    ) -> float | D:
        v = m.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float):
            self.add(join(path, key), f"expected a number, got {_kind(v)}")
            return default
        if not _in_range(v, lo, hi):
            self.add(join(path, key), f"{v} is out of range{_range(lo, hi)}")
            return default
        return float(v)

    def bound(
        self, m: Mapping[str, object], key: str, path: str, default: float | None
    ) -> float | None:
        """A non-negative number of seconds; an explicit ``null`` means no bound."""
        if key in m and m[key] is None:
            return None
        return self.number(m, key, path, default, lo=0.0)

    def choice(
        self,
        m: Mapping[str, object],
        key: str,
        path: str,
        options: tuple[C, ...],
        default: D,
        *,
        required: bool = False,
    ) -> C | D:
        v = self._get(m, key, path, required)
        if v is None:
            return default
        for o in options:
            if v == o:
                return o
        self.add(join(path, key), f"unknown value {v!r} (known: {', '.join(options)})")
        return default


def _in_range(v: float, lo: float | None, hi: float | None) -> bool:
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def _range(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f" ({lo}..{hi})"
    if lo is not None:
        return f" (at least {lo})"
    return f" (at most {hi})"


def _kind(v: object) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return f"a number ({v})"
    if isinstance(v, str):
        return f"a string ({v!r})" if v else "an empty string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__

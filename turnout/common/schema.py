"""The one path-tracking reader over parsed YAML: the router's config and policy params.

A :class:`Reader` wraps one mapping and its key path (``backends[0]``,
``policies.adaptive.params.scorers[1]``). Each read checks one key; a wrong value records
``(path, message)`` in an error list shared by the whole document and returns a usable
fallback, so validation carries on and the user sees every problem at once.
:meth:`Reader.done` reports the keys that nothing read.

Messages say what kind of value was expected and what kind was found, never the value: a key
pasted into the wrong field, or a URL with credentials, must not reach a log or an HTTP
answer. Only names are quoted: an unknown key, and a name the config uses to refer to
something it defines elsewhere (a plugin type, a backend, an engine, a policy), each beside
the nearest known one (a typo's likely fix) or else the known ones; and numbers beside the
bound they broke.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, overload

D = TypeVar("D")
C = TypeVar("C", bound=str)
Errors = list[tuple[str, str]]
"""``(key path, message)`` pairs, in the order found."""


def join(path: str, key: str | int) -> str:
    """``params`` + ``by`` -> ``params.by``; ``filters`` + 1 -> ``filters[1]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def kind(value: object) -> str:
    """What ``value`` is, in YAML's words, for messages that must not show the value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string" if value else "empty string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return type(value).__name__  # YAML timestamps and binaries


def unknown(name: str, known: Iterable[str], what: str = "") -> str:
    """``unknown backend 'vlm' (did you mean 'vllm'?)`` when a known name is close to
    ``name``, else ``unknown backend 'x' (known: a, b)``: for a name the config refers to, and
    (``what="key"``) for a key nothing reads."""
    noun = f"{what} " if what else ""
    names = list(known)
    near = nearest(name, names)
    if near is not None:
        return f"unknown {noun}{name!r} (did you mean {near!r}?)"
    return f"unknown {noun}{name!r} (known: {', '.join(names) or 'none'})"


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name most like ``name`` (case aside), if one is close enough to be a typo."""
    by_lower: dict[str, str] = {}
    for k in known:
        by_lower.setdefault(k.lower(), k)
    match = difflib.get_close_matches(name.lower(), by_lower, n=1)
    return by_lower[match[0]] if match else None


@dataclass(slots=True)
class Reader:
    """A typed reader over one mapping; every error goes to the shared ``errors`` list."""

    raw: Mapping[str, object]
    path: str
    errors: Errors
    _seen: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, raw: object, path: str, errors: Errors, *, required: bool = False) -> Reader:
        """Wrap ``raw`` (``None`` means empty, an error when ``required``)."""
        if raw is None:
            if required:
                errors.append((path, "is required"))
            return cls({}, path, errors)
        if not isinstance(raw, Mapping):
            errors.append((path, f"expected a mapping, got {kind(raw)}"))
            # Read the rest as empty without reporting: "x is required" under a value that is
            # not even a mapping would only repeat the one real error.
            return cls({}, path, [])
        # YAML keys may be numbers or booleans; as strings they are reported as unknown keys.
        return cls({str(k): v for k, v in raw.items()}, path, errors)

    def error(self, key: str | int | None, message: str) -> None:
        """Record an error at ``path.key`` (at this mapping's own path when ``key`` is None)."""
        self.errors.append((self.path if key is None else join(self.path, key), message))

    def has(self, key: str) -> bool:
        """Whether ``key`` was given (marks it as known)."""
        self._seen.add(key)
        return key in self.raw

    def raw_value(self, key: str) -> object:
        """The unvalidated value (marks the key as known)."""
        self._seen.add(key)
        return self.raw.get(key)

    def names(self) -> list[str]:
        """Every key given, for a mapping whose keys are names (all count as known)."""
        self._seen.update(self.raw)
        return list(self.raw)

    def child(self, key: str, *, required: bool = False) -> Reader:
        """A reader over the nested mapping at ``key`` (absent means empty)."""
        return Reader.of(self.raw_value(key), join(self.path, key), self.errors, required=required)

    def entries(
        self, key: str, *, required: bool = False, non_empty: bool = False
    ) -> list[tuple[str, object]]:
        """The items of the list at ``key``, each with its path (``key[i]``)."""
        value = self._value(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(key, f"expected a list, got {kind(value)}")
            return []
        if non_empty and not value:
            self.error(key, "must list at least one entry")
        return [(join(join(self.path, key), i), item) for i, item in enumerate(value)]

    @overload
    def string(self, key: str, *, required: bool = False) -> str | None: ...
    @overload
    def string(self, key: str, default: D, *, required: bool = False) -> str | D: ...
    def string(self, key: str, default: object = None, *, required: bool = False) -> object:
        """A non-empty string; ``default`` (None unless given) when absent or wrong."""
        value = self._value(key, required)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            self.error(key, f"expected a non-empty string, got {kind(value)}")
            return default
        return value

    def string_list(
        self, key: str, *, required: bool = False, non_empty: bool = False
    ) -> list[str] | None:
        """A list of non-empty strings; None if absent."""
        value = self._value(key, required)
        if value is None:
            return None
        if not isinstance(value, list):
            self.error(key, f"expected a list of strings, got {kind(value)}")
            return None
        if non_empty and not value:
            self.error(key, "must list at least one entry")
        out: list[str] = []
        for i, item in enumerate(value):
            if isinstance(item, str) and item:
                out.append(item)
            else:
                self.error(join(key, i), f"expected a non-empty string, got {kind(item)}")
        return out

    def flag(self, key: str, default: D) -> bool | D:
        """``true`` or ``false``."""
        value = self.raw_value(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.error(key, f"expected true or false, got {kind(value)}")
            return default
        return value

    def integer(
        self, key: str, default: D, *, low: int | None = 0, high: int | None = None
    ) -> int | D:
        """A whole number in [low, high]; counts are never negative unless ``low`` says so."""
        value = self.raw_value(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"expected an integer, got {kind(value)}")
            return default
        return value if self._within(key, value, low, high) else default

    def number(
        self, key: str, default: D, *, low: float | None = None, high: float | None = None
    ) -> float | D:
        """A number in [low, high]."""
        value = self.raw_value(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            self.error(key, f"expected a number, got {kind(value)}")
            return default
        return float(value) if self._within(key, value, low, high) else default

    def bound(self, key: str, default: float | None) -> float | None:
        """A non-negative number of seconds; an explicit ``null`` means no bound."""
        if self.has(key) and self.raw[key] is None:
            return None
        return self.number(key, default, low=0.0)

    def choice(
        self, key: str, options: Sequence[C], default: D, *, required: bool = False
    ) -> C | D:
        """One of ``options``."""
        value = self._value(key, required)
        if value is None:
            return default
        for option in options:
            if value == option:
                return option
        # Not quoted: a keyword list is short, and what was written there may be anything.
        self.error(key, f"expected one of {', '.join(options)}, got {kind(value)}")
        return default

    def done(self) -> None:
        """Report every key that no read asked for."""
        for key in self.raw:
            if key not in self._seen:
                self.error(key, unknown(key, sorted(self._seen), "key"))

    def _value(self, key: str, required: bool) -> object:
        value = self.raw_value(key)
        if value is None and required:
            self.error(key, "is required")
        return value

    def _within(self, key: str, value: float, low: float | None, high: float | None) -> bool:
        if low is not None and value < low:
            self.error(key, f"{value} is below the minimum {low:g}")
            return False
        if high is not None and value > high:
            self.error(key, f"{value} is above the maximum {high:g}")
            return False
        return True

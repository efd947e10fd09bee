"""Validation of plugin ``params`` mappings, collecting every error with its key path.

Each plugin factory reads its params through a :class:`Params`; a wrong value records an
error (path, message) and returns a usable fallback so validation carries on and the user
sees all problems at once. :meth:`Params.done` rejects the keys nobody asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies.base import NullObserver, PipelineObserver
from policies.types import REQUEST_CLASSES, BackendInfo, RequestClass

ErrorList = list[tuple[str, str]]


def join_path(prefix: str, key: str | int) -> str:
    """``params`` + ``by`` -> ``params.by``; ``filters`` + 1 -> ``filters[1]``."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


def type_name(value: object) -> str:
    """A YAML-ish name for a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, Sequence):
        return "list"
    return type(value).__name__


@dataclass(slots=True)
class Params:
    """A typed reader over one params mapping; errors go to the shared ``errors`` list."""

    raw: Mapping[str, object]
    path: str
    errors: ErrorList
    _seen: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, raw: object, path: str, errors: ErrorList) -> Params:
        """Wrap ``raw`` (``None`` means empty); a non-mapping is an error."""
        if raw is None:
            return cls({}, path, errors)
        if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
            errors.append((path, f"expected a mapping, got {type_name(raw)}"))
            # Read the rest as empty without reporting: "x is required" under a value that is
            # not even a mapping would only repeat the one real error.
            return cls({}, path, [])
        return cls(raw, path, errors)

    def error(self, key: str | int, message: str) -> None:
        """Record an error at ``path.key``."""
        self.errors.append((join_path(self.path, key), message))

    def has(self, key: str) -> bool:
        """Whether ``key`` was given (marks it as known)."""
        self._seen.add(key)
        return key in self.raw

    def raw_value(self, key: str) -> object:
        """The unvalidated value (marks the key as known)."""
        self._seen.add(key)
        return self.raw.get(key)

    def child(self, key: str) -> Params:
        """A reader over a nested mapping (missing means empty)."""
        return Params.of(self.raw_value(key), join_path(self.path, key), self.errors)

    def number(
        self, key: str, default: float, *, low: float | None = None, high: float | None = None
    ) -> float:
        """A number within [low, high] (inclusive); ``default`` when absent or invalid."""
        value = self.raw_value(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(key, f"expected a number, got {type_name(value)}")
            return default
        if low is not None and value < low:
            self.error(key, f"{value} is below the minimum {low:g}")
            return default
        if high is not None and value > high:
            self.error(key, f"{value} is above the maximum {high:g}")
            return default
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """A boolean."""
        value = self.raw_value(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.error(key, f"expected true or false, got {type_name(value)}")
            return default
        return value

    def integer(self, key: str, default: int, *, low: int = 0) -> int:
        """A whole number >= ``low``."""
        value = self.raw_value(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"expected an integer, got {type_name(value)}")
            return default
        if value < low:
            self.error(key, f"{value} is below the minimum {low}")
            return default
        return value

    def choice(self, key: str, options: Sequence[str], default: str) -> str:
        """One of ``options``."""
        value = self.raw_value(key)
        if value is None:
            return default
        if not isinstance(value, str) or value not in options:
            self.error(key, f"unknown {value!r} (known: {', '.join(options)})")
            return default
        return value

    def string(self, key: str) -> str | None:
        """An optional non-empty string."""
        value = self.raw_value(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.error(key, f"expected a non-empty string, got {type_name(value)}")
            return None
        return value

    def string_list(
        self, key: str, *, required: bool = False, non_empty: bool = False
    ) -> list[str] | None:
        """An optional list of strings (a single string counts as a list of one)."""
        value = self.raw_value(key)
        if value is None:
            if required:
                self.error(key, "is required")
            return None
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            self.error(key, f"expected a list of strings, got {type_name(value)}")
            return None
        if non_empty and not value:
            self.error(key, "must list at least one backend or engine")
        out: list[str] = []
        for i, item in enumerate(value):
            if isinstance(item, str) and item:
                out.append(item)
            else:
                self.error(join_path(key, i), f"expected a string, got {type_name(item)}")
        return out

    def done(self) -> None:
        """Report every key that no reader asked for."""
        for key in self.raw:
            if key not in self._seen:
                known = ", ".join(sorted(self._seen)) or "none"
                self.error(key, f"unknown key (known: {known})")


@dataclass(frozen=True, slots=True)
class BuildContext:
    """The configured backends, and resolution of names/engine kinds against them."""

    backends: tuple[BackendInfo, ...]
    observer: PipelineObserver = field(default_factory=NullObserver)
    """Where pipeline policies report each plugin's run time and each emptied candidate set."""

    @property
    def engines(self) -> tuple[str, ...]:
        """Engine kinds in configuration order, without repeats."""
        return tuple(dict.fromkeys(b.engine for b in self.backends))

    def resolve(self, p: Params, key: str, entries: Sequence[str]) -> list[list[str]]:
        """Each entry -> the backend names it means, in configuration order.

        An entry is an engine kind (every backend of that kind) or a backend name. Unknown
        entries are errors at ``key[i]``; an entry naming backends already listed earlier is
        an error too, since a backend can hold only one place in an ordering.
        """
        out: list[list[str]] = []
        taken: set[str] = set()
        for i, entry in enumerate(entries):
            names = [b.name for b in self.backends if b.engine == entry] or [
                b.name for b in self.backends if b.name == entry
            ]
            if not names:
                known = ", ".join(sorted({*self.engines, *(b.name for b in self.backends)}))
                p.error(join_path(key, i), f"unknown backend or engine {entry!r} (known: {known})")
                continue
            if taken.intersection(names):
                p.error(join_path(key, i), f"{entry!r} repeats a backend listed before it")
                continue
            taken.update(names)
            out.append(names)
        return out


def class_orders(p: Params, ctx: BuildContext) -> dict[RequestClass, list[list[str]]]:
    """Params ``{interactive: [...], batch: [...]}`` -> per class, tiers of backend names.

    Every class must be listed (so no request class is silently left without backends);
    entries are backend names or engine kinds, in preference order.
    """
    out: dict[RequestClass, list[list[str]]] = {}
    for cls in REQUEST_CLASSES:
        entries = p.string_list(cls, required=True, non_empty=True)
        if entries is not None:
            out[cls] = ctx.resolve(p, cls, entries)
    p.done()
    return out

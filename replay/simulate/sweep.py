"""``--set KEY=V1,V2,...``: a grid of config variants, each validated as the router would.

``KEY`` is a path into the config document: mapping keys joined by dots, list items by
``[i]`` (``policies.adaptive.params.spill.max_inflight``, ``backends[0].max_inflight``,
``health.scrape_interval``). Each value is read as a YAML scalar (``8`` is a number, ``true`` a
boolean). Missing mapping keys on the way are created, so a param the config leaves at its
default can be swept too. Several ``--set`` options make the cartesian product.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")

Setting = tuple[tuple[str, Any], ...]
"""One grid point: (key path, value) for every swept key."""


@dataclass(frozen=True, slots=True)
class Sweep:
    """One ``--set`` option: a key path and the values it takes."""

    key: str
    values: tuple[Any, ...]


def parse_set(text: str) -> Sweep:
    """``KEY=V1,V2,...`` -> :class:`Sweep`; raises ValueError when it is not that."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise ValueError(f"expected KEY=V1,V2,... (got {text!r})")
    _steps(key)
    parsed = []
    for v in values.split(","):
        try:
            parsed.append(yaml.safe_load(v.strip()))
        except yaml.YAMLError:
            raise ValueError(f"{key}: {v.strip()!r} is not a YAML scalar") from None
    return Sweep(key, tuple(parsed))


def _steps(key: str) -> list[str | int]:
    steps: list[str | int] = []
    pos = 0
    for m in _STEP.finditer(key):
        if m.start() != pos and key[pos : m.start()] != ".":
            raise ValueError(f"{key!r} is not a key path (a.b[0].c)")
        steps.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if pos != len(key) or not steps:
        raise ValueError(f"{key!r} is not a key path (a.b[0].c)")
    return steps


def grid(sweeps: list[Sweep]) -> Iterator[Setting]:
    """Every combination of the swept values (one empty setting when nothing is swept)."""
    for combo in itertools.product(*(s.values for s in sweeps)):
        yield tuple((s.key, v) for s, v in zip(sweeps, combo, strict=True))


def apply(doc: object, setting: Setting) -> object:
    """A copy of the config document with ``setting``'s values in place."""
    out = copy.deepcopy(doc)
    for key, value in setting:
        steps = _steps(key)
        node: Any = out
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            if isinstance(step, int):
                if not isinstance(node, list) or step >= len(node):
                    raise ValueError(f"{key}: no item [{step}] there")
                if last:
                    node[step] = value
                else:
                    node = node[step]
                continue
            if not isinstance(node, dict):
                raise ValueError(f"{key}: {step!r} is not under a mapping")
            if last:
                node[step] = value
            else:
                node = node.setdefault(step, {})
    return out


def label(policy: str, setting: Setting) -> str:
    """The run's name in the report: the policy, then its setting, each key by as few of
    its last parts as tell the swept keys apart (``adaptive [max_inflight=8]`` for
    ``policies.adaptive.params.spill.max_inflight``), so that tables and charts stay
    narrow; the report's ``sweep`` and each run's ``simulation.setting`` name the keys whole."""
    if not setting:
        return policy
    keys = [k for k, _ in setting]
    return f"{policy} [" + ", ".join(f"{short(k, keys)}={v}" for k, v in setting) + "]"


def short(key: str, keys: Sequence[str]) -> str:
    """The fewest last parts of ``key`` (dots) that no other of ``keys`` ends with."""
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        tail = ".".join(parts[-n:])
        if not any(k != key and (k == tail or k.endswith("." + tail)) for k in keys):
            return tail
    return key

"""A small reader for the repository's Dockerfile: stages, instructions and exec-form argv.

There is no Docker engine on the development machines, so the deploy tests read the file
instead of building it. Only what the Dockerfile uses is understood: line continuations,
comments, ``FROM ... AS name`` and JSON (exec-form) arguments.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case) and its argument text."""

    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON argv of ``CMD [...]`` / ``HEALTHCHECK ... CMD [...]``."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text[text.index("CMD") + len("CMD") :]
        argv = json.loads(text)
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        return argv

    def words(self) -> list[str]:
        return shlex.split(self.args)


@dataclass(frozen=True)
class Stage:
    """A build stage: its base image, its name and its instructions after FROM."""

    base: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def read_dockerfile(path: Path) -> list[Stage]:
    """Stages in order; raises AssertionError on anything before the first FROM."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):  # also allowed inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    opened: list[tuple[str, str | None, list[Instruction]]] = []
    for text in logical:
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            words = instruction.words()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            opened.append((words[0], name, []))
            continue
        assert opened, f"{keyword} before the first FROM"
        opened[-1][2].append(instruction)
    return [Stage(base, name, tuple(body)) for base, name, body in opened]


def copy_sources(instruction: Instruction) -> tuple[list[str], str, str | None]:
    """``(sources, destination, from_stage)`` of a COPY (flags such as --chown dropped)."""
    words = instruction.words()
    from_stage = None
    plain = []
    for w in words:
        if w.startswith("--from="):
            from_stage = w.split("=", 1)[1]
        elif not w.startswith("--"):
            plain.append(w)
    return plain[:-1], plain[-1], from_stage

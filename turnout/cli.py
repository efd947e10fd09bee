"""The ``turnout`` command: one entry point, a subcommand per job.

Each subcommand's module is imported only when it runs, so ``turnout emulator`` does not load
the router and ``turnout --help`` loads nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

from turnout import __version__
from turnout.common.pipes import closes_quietly


class Command(NamedTuple):
    summary: str
    run: Callable[[list[str]], int]


def _serve(argv: list[str]) -> int:
    from router.cli import serve_main

    return serve_main(argv)


def _check(argv: list[str]) -> int:
    from router.cli import check_main

    return check_main(argv)


def _print_default(argv: list[str]) -> int:
    from router.cli import print_default_main

    return print_default_main(argv)


def _replay(argv: list[str]) -> int:
    from replay.cli import main as replay_main

    return replay_main(argv)


def _emulator(argv: list[str]) -> int:
    from emulator.cli import main as emulator_main

    return emulator_main(argv)


COMMANDS: dict[str, Command] = {
    "serve": Command(
        "run the router (default: the embedded config with two emulated engines)", _serve
    ),
    "check-config": Command("validate a config file; exit 2 listing every error", _check),
    "print-default-config": Command(
        "print the embedded default config to start your own", _print_default
    ),
    "replay": Command(
        "replay a capture or trace through a target; also simulate, merge, convert", _replay
    ),
    "emulator": Command("serve one emulated OpenAI-compatible engine", _emulator),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: turnout [--version] [--help] COMMAND [ARGS...]",
        "",
        "Turnout routes OpenAI-compatible traffic between inference engines by policy.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items()),
        "",
        "`turnout COMMAND --help` shows its options; `replay` is also a command of its own.",
    ]
    return "\n".join(lines) + "\n"


@closes_quietly
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"turnout {__version__}")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        sys.stderr.write(f"turnout: unknown command {args[0]!r}\n\n{usage()}")
        return 2
    return command.run(args[1:])

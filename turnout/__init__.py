"""Turnout: the router LLM platform teams put in front of their OpenAI-compatible engines.

This package holds what the router, the replayer and the emulator share (``turnout.common``),
the embedded configs (``turnout.config``, installed from the repository's config/) and the
one command (``turnout.cli``). The parts themselves are the top-level packages ``router``,
``policies``, ``replay`` and ``emulator``.
"""

__version__ = "0.1.0"

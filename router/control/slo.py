"""SLO goodput: which class targets each policy's requests are judged against.

The targets are the ``slo`` params of an ``adaptive`` policy: its own for an adaptive
policy, otherwise the default policy's (when adaptive) or the first adaptive policy's, so
every policy of one router is judged by the same yardstick and their goodput compares.
A router without any adaptive policy counts no goodput.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.adaptive import AdaptivePolicy
from policies.base import Policy
from policies.types import RequestClass, Slo

SloTable = Mapping[str, Mapping[RequestClass, Slo]]
"""Policy name -> class -> targets."""


def slo_table(policies: Mapping[str, Policy], default_policy: str) -> SloTable:
    """Per policy, the SLOs its requests are judged against (see the module docstring)."""
    adaptive = {n: p.settings.slo for n, p in policies.items() if isinstance(p, AdaptivePolicy)}
    if not adaptive:
        return {}
    shared = adaptive.get(default_policy) or next(iter(adaptive.values()))
    return {name: adaptive.get(name, shared) for name in policies}

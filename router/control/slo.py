"""SLO goodput: which class targets each policy's requests are judged against.

The targets are those a policy declares (:class:`policies.base.Judged`; ``adaptive`` takes
them from its ``slo`` params): its own for such a policy, otherwise the default policy's
(when it declares some) or the first declaring policy's, so every policy of one router is
judged by the same yardstick and their goodput compares. A router without any such policy
counts no goodput.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.base import Judged, Policy
from policies.types import RequestClass, Slo

SloTable = Mapping[str, Mapping[RequestClass, Slo]]
"""Policy name -> class -> targets."""


def slo_table(policies: Mapping[str, Policy], default_policy: str) -> SloTable:
    """Per policy, the SLOs its requests are judged against (see the module docstring)."""
    declared = {n: p.slo for n, p in policies.items() if isinstance(p, Judged)}
    if not declared:
        return {}
    shared = declared.get(default_policy) or next(iter(declared.values()))
    return {name: declared.get(name, shared) for name in policies}

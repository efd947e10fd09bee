"""Parsing of the ``admission`` and ``shadow`` config sections (called by config.py).

Same conventions as every other section: frozen settings from :mod:`router.config.model`, unknown
keys rejected, every error reported with its key path.
"""

from __future__ import annotations

from common.schema import Reader
from policies.types import REQUEST_CLASSES
from router.config.model import AdmissionSettings, ClassAdmission, ShadowSettings


def admission_settings(r: Reader, v: object) -> AdmissionSettings:
    """The ``admission`` section (absent: queues of size 0, i.e. 429 at once)."""
    p = "admission"
    m = r.mapping(v, p, [*REQUEST_CLASSES, "retry_after"], optional=True)
    d = ClassAdmission()
    classes: dict[str, ClassAdmission] = {}
    for cls in REQUEST_CLASSES:
        if cls not in m:
            continue
        cp = f"{p}.{cls}"
        c = r.mapping(m[cls], cp, ["queue_size", "max_wait"])
        classes[cls] = ClassAdmission(
            queue_size=r.integer(c, "queue_size", cp, default=d.queue_size, lo=0),
            max_wait=r.number(c, "max_wait", cp, default=d.max_wait, lo=0.0),
        )
    return AdmissionSettings(
        classes=classes, retry_after=r.number(m, "retry_after", p, default=1.0, lo=0.0)
    )


def shadow_settings(
    r: Reader, v: object, backends: set[str], policies: set[str]
) -> dict[str, ShadowSettings]:
    """The ``shadow`` section: served policy name -> its mirror (names checked)."""
    m = r.mapping(v, "shadow", None, optional=True)
    out = {}
    d = ShadowSettings()
    for served, entry in m.items():
        p = f"shadow.{served}"
        if served not in policies:
            r.add(p, f"unknown policy '{served}' (known: {', '.join(sorted(policies))})")
        e = r.mapping(entry, p, list(_SHADOW_KEYS))
        backend = r.string(e, "backend", p, default=None)
        policy = r.string(e, "policy", p, default=None)
        if (backend is None) == (policy is None):
            r.add(p, "give exactly one of backend (a name) or policy (a policy name)")
        elif backend is not None and backend not in backends:
            r.add(f"{p}.backend", f"unknown backend '{backend}'")
        elif policy is not None and policy not in policies:
            r.add(f"{p}.policy", f"unknown policy '{policy}'")
        out[served] = ShadowSettings(
            backend=backend,
            policy=policy,
            sample=r.number(e, "sample", p, default=d.sample, lo=0.0, hi=1.0),
            request_class=r.choice(e, "class", p, REQUEST_CLASSES, default=None),
            max_concurrency=r.integer(e, "max_concurrency", p, default=d.max_concurrency, lo=1),
            timeout=r.number(e, "timeout", p, default=d.timeout, lo=0.01),
        )
    return out


_SHADOW_KEYS = ("backend", "policy", "sample", "class", "max_concurrency", "timeout")

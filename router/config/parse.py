"""The router's configuration: parsed once from YAML into :mod:`router.config.model`'s objects.

Every problem is reported at once with its key path (``backends[1].url: ...``) and unknown
keys are rejected, through the one reader of :mod:`turnout.common.schema`; no message shows a
configured value. Policy entries are checked for shape here and their params by the policy
registry (:func:`router.app.build_policies`): :func:`read_config` returns a best-effort config
beside its errors so that those checks, and the API keys', run in the same pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from policies.types import REQUEST_CLASSES
from router.config.backends import read_backends, read_pricing
from router.config.batch import read_batch
from router.config.limits import read_anonymous, read_api_keys, read_limits
from router.config.model import (
    DEFAULT_CAPTURE_HEADERS,
    ENDPOINTS,
    REDACTIONS,
    AccessLogSettings,
    AdmissionSettings,
    CaptureSettings,
    ClassAdmission,
    ClassificationSettings,
    ClassTimeouts,
    ConfigError,
    FailoverSettings,
    HealthSettings,
    ListenSettings,
    PolicySpec,
    RouterConfig,
    Rule,
    ShadowSettings,
    ShutdownSettings,
    credential_header,
)
from router.config.tail import read_tail
from turnout.common.schema import Errors, Reader, join, unknown

__all__ = ["load_config", "load_document", "parse_config", "read_config"]


def load_config(path: str | Path) -> RouterConfig:
    """Read and validate a YAML file; raises :class:`ConfigError` with every problem."""
    errors: Errors = []
    return _valid(read_config(path, errors), errors)


def load_document(path: str | Path) -> object:
    """The file's YAML document, unvalidated (to change keys before :func:`parse_config`)."""
    errors: Errors = []
    doc = _document(Path(path), errors)
    if errors:
        raise ConfigError(errors)
    return doc


def parse_config(doc: object) -> RouterConfig:
    """Validate a parsed YAML document; raises :class:`ConfigError` with every problem."""
    errors: Errors = []
    return _valid(parse_document(doc, errors), errors)


def read_config(path: str | Path, errors: Errors) -> RouterConfig:
    """The file's config at best effort: each problem goes to ``errors`` and a fallback stands
    in for the value (nothing at all for a file that cannot be read as YAML)."""
    before = len(errors)
    doc = _document(Path(path), errors)
    if len(errors) > before:
        return RouterConfig(backends=(), policies=(), default_policy="")
    return parse_document(doc, errors)


def parse_document(doc: object, errors: Errors) -> RouterConfig:
    """A parsed YAML document at best effort, as :func:`read_config`.

    Policy and API key entries with errors are left out, so that building them reports
    nothing twice; backends stay (with fallbacks) since policies refer to them by name.
    """
    top = Reader.of(doc, "", errors)
    backends = read_backends(top)
    policies, policy_names = _policies(top)
    default_policy = top.string("default_policy", "", required=True)
    if default_policy and policy_names and default_policy not in policy_names:
        top.error("default_policy", unknown(default_policy, policy_names, "policy"))
    names = [b.name for b in backends]
    config = RouterConfig(
        backends=backends,
        policies=policies,
        default_policy=default_policy,
        listen=_listen(top.child("listen")),
        honor_policy_header=top.flag("honor_policy_header", True),
        aliases=_aliases(top.child("aliases"), names),
        api_keys=read_api_keys(top, policy_names),
        require_api_key=top.flag("require_api_key", False),
        anonymous=read_anonymous(top.child("anonymous"))
        if top.raw_value("anonymous") is not None
        else None,
        metrics_require_admin=top.flag("metrics_require_admin", False),
        classification=_classification(top.child("classification")),
        timeouts=_timeouts(top.child("timeouts")),
        failover=_failover(top.child("failover")),
        health=_health(top.child("health")),
        capture=_capture(top.child("capture")) if top.raw_value("capture") is not None else None,
        access_log=_access_log(top.child("access_log")),
        admission=_admission(top.child("admission")),
        limits=read_limits(top.child("limits")),
        shutdown=_shutdown(top.child("shutdown")),
        shadow=_shadow(top.child("shadow"), names, policy_names),
        batch=read_batch(top.child("batch")) if top.has("batch") else None,
        pricing=read_pricing(top.child("pricing"), names),
        tail=read_tail(top.child("tail")),
    )
    top.done()
    return config


def _valid(config: RouterConfig, errors: Errors) -> RouterConfig:
    if errors:
        raise ConfigError(errors)
    return config


def _document(path: Path, errors: Errors) -> object:
    """The YAML document in ``path``; None (and an error) when it cannot be had.

    PyYAML's own messages quote the offending line, an alias or a tag, any of which may be a
    secret: the error says where and what kind of problem, never what was written.
    """
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        problem = f"cannot read {path}: {exc.strerror}"
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (byte {exc.start} cannot be decoded)"
    except (yaml.scanner.ScannerError, yaml.parser.ParserError) as exc:
        problem = f"not valid YAML{_where(exc)}: {exc.problem}"  # quotes one character or token
    except yaml.MarkedYAMLError as exc:
        problem = f"not valid YAML{_where(exc)}: an alias, tag or key it cannot resolve"
    except yaml.reader.ReaderError as exc:
        problem = f"not valid YAML: a character it does not allow (character {exc.position})"
    except ValueError:  # raised by the constructor of an explicit type, e.g. !!int or a date
        problem = "not valid YAML: a value its type does not allow"
    except RecursionError:
        problem = "not valid YAML: nested too deeply"
    errors.append(("", problem))
    return None


def _where(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def _listen(m: Reader) -> ListenSettings:
    d = ListenSettings()
    out = ListenSettings(
        host=m.string("host", d.host),
        port=m.integer("port", d.port, high=65535),
        max_body_bytes=m.integer("max_body_bytes", d.max_body_bytes, low=1),
    )
    m.done()
    return out


def _aliases(m: Reader, backends: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for alias in m.names():
        targets = m.child(alias, required=True)
        if not targets.raw and isinstance(m.raw[alias], dict):
            targets.error(None, "maps no backend")
        for backend in targets.names():
            if backend not in backends:
                targets.error(backend, unknown(backend, backends, "backend"))
        out[alias] = {b: targets.string(b, "", required=True) for b in targets.raw}
    return out


_RULE_INTS = (
    "max_tokens_at_least",
    "max_tokens_below",
    "prompt_tokens_at_least",
    "prompt_tokens_below",
)


def _classification(m: Reader) -> ClassificationSettings:
    rules = []
    for path, item in m.entries("rules"):
        r = Reader.of(item, path, m.errors, required=True)
        rule = Rule(
            request_class=r.choice("class", REQUEST_CLASSES, "interactive", required=True),
            endpoint=r.choice("endpoint", ENDPOINTS, None),
            stream=r.flag("stream", None),
            **{k: r.integer(k, None) for k in _RULE_INTS},
        )
        if len(r.raw) == 1 and r.has("class"):
            r.error(None, "a rule needs at least one condition besides its class")
        r.done()
        rules.append(rule)
    out = ClassificationSettings(
        default=m.choice("default", REQUEST_CLASSES, "interactive"),
        honor_header=m.flag("honor_header", True),
        flex_is_batch=m.flag("flex_is_batch", True),
        rules=tuple(rules),
    )
    m.done()
    return out


def _policies(top: Reader) -> tuple[tuple[PolicySpec, ...], list[str]]:
    """The well-formed policy entries, and every policy name given."""
    m = top.child("policies", required=True)
    out = []
    for name in m.names():
        before = len(m.errors)
        e = m.child(name, required=True)
        policy_type = e.string("type", "", required=True)
        params = e.child("params").raw  # its keys are the registry's to check
        e.done()
        if len(m.errors) == before:
            out.append(PolicySpec(name=name, type=policy_type, params=params))
    return tuple(out), list(m.raw)


def _timeouts(m: Reader) -> dict[str, ClassTimeouts]:
    out: dict[str, ClassTimeouts] = {}
    d = ClassTimeouts()
    for cls in REQUEST_CLASSES:
        if m.has(cls):
            t = m.child(cls, required=True)
            out[cls] = ClassTimeouts(
                connect=t.bound("connect", d.connect),
                first_byte=t.bound("first_byte", d.first_byte),
                idle=t.bound("idle", d.idle),
                total=t.bound("total", d.total),
                non_stream_total=t.bound("non_stream_total", d.non_stream_total),
            )
            t.done()
    m.done()
    return out


def _failover(m: Reader) -> FailoverSettings:
    d = FailoverSettings()
    out = FailoverSettings(
        max_attempts=m.integer("max_attempts", d.max_attempts, low=1, high=20),
        backoff_initial=m.number("backoff_initial", d.backoff_initial, low=0.0),
        backoff_max=m.number("backoff_max", d.backoff_max, low=0.0),
    )
    m.done()
    return out


def _health(m: Reader) -> HealthSettings:
    d = HealthSettings()
    out = HealthSettings(
        interval=m.number("interval", d.interval, low=0.01),
        timeout=m.number("timeout", d.timeout, low=0.01),
        failures_to_eject=m.integer("failures_to_eject", d.failures_to_eject, low=1),
        cooldown=m.number("cooldown", d.cooldown, low=0.0),
        cooldown_max=m.number("cooldown_max", d.cooldown_max, low=0.0),
        max_ejected_fraction=m.number(
            "max_ejected_fraction", d.max_ejected_fraction, low=0.0, high=1.0
        ),
        models_refresh=m.number("models_refresh", d.models_refresh, low=0.1),
        scrape_metrics=m.flag("scrape_metrics", d.scrape_metrics),
        scrape_interval=m.number("scrape_interval", d.scrape_interval, low=0.01),
        scrape_stale_after=m.number("scrape_stale_after", d.scrape_stale_after, low=0.01),
    )
    m.done()
    return out


def _capture(m: Reader) -> CaptureSettings:
    d = CaptureSettings(path="")
    listed = m.string_list("headers")
    headers = DEFAULT_CAPTURE_HEADERS if listed is None else listed
    for i, h in enumerate(headers):
        if credential_header(h):
            m.error(join("headers", i), f"{h!r} may carry a credential and is never captured")
    out = CaptureSettings(
        path=m.string("path", "", required=True),
        sample_rate=m.number("sample_rate", 1.0, low=0.0, high=1.0),
        redaction=m.choice("redaction", REDACTIONS, "none"),
        rotate_bytes=m.integer("rotate_bytes", None, low=1),
        headers=tuple(h.lower() for h in headers),
        queue_size=m.integer("queue_size", d.queue_size, low=1),
        queue_bytes=m.integer("queue_bytes", d.queue_bytes, low=1),
        hash_key=_capture_key(m),
    )
    m.done()
    return out


_MIN_KEY_BYTES = 16


def _capture_key(m: Reader) -> bytes | None:
    """The capture's secret, from ``hash_key_env`` or ``hash_key_file`` (stripped); the
    messages name the variable or the file, never the key."""
    env, file = m.string("hash_key_env"), m.string("hash_key_file")
    if env is not None and file is not None:
        m.error(None, "give only one of hash_key_env or hash_key_file")
        return None
    if env is not None:
        where = "hash_key_env"
        key = os.environ.get(env, "").strip().encode("utf-8", "surrogateescape")
        if not key:
            m.error(where, f"${env} is not set")
            return None
    elif file is not None:
        where = "hash_key_file"
        try:
            key = Path(file).read_bytes().strip()
        except OSError as exc:
            m.error(where, f"cannot read {file}: {exc.strerror}")
            return None
    else:
        return None
    if len(key) < _MIN_KEY_BYTES:
        m.error(where, f"the key must be at least {_MIN_KEY_BYTES} bytes (e.g. 32 random in hex)")
        return None
    return key


def _admission(m: Reader) -> AdmissionSettings:
    """Absent: queues of size 0, i.e. 429 at once."""
    d = ClassAdmission()
    classes: dict[str, ClassAdmission] = {}
    for cls in REQUEST_CLASSES:
        if m.has(cls):
            c = m.child(cls, required=True)
            classes[cls] = ClassAdmission(
                queue_size=c.integer("queue_size", d.queue_size),
                max_wait=c.number("max_wait", d.max_wait, low=0.0),
                reserve=c.integer("reserve", d.reserve, low=0),
                active_window=c.number("active_window", d.active_window, low=0.0),
            )
            c.done()
    out = AdmissionSettings(classes=classes, retry_after=m.number("retry_after", 1.0, low=0.0))
    m.done()
    return out


def _shadow(m: Reader, backends: list[str], policies: list[str]) -> dict[str, ShadowSettings]:
    """Served policy name -> its mirror."""
    out = {}
    d = ShadowSettings()
    for served in m.names():
        if served not in policies:
            m.error(served, unknown(served, policies, "policy"))
        e = m.child(served, required=True)
        backend, policy = e.string("backend"), e.string("policy")
        if (backend is None) == (policy is None):
            e.error(None, "give exactly one of backend (a name) or policy (a policy name)")
        elif backend is not None and backend not in backends:
            e.error("backend", unknown(backend, backends, "backend"))
        elif policy is not None and policy not in policies:
            e.error("policy", unknown(policy, policies, "policy"))
        out[served] = ShadowSettings(
            backend=backend,
            policy=policy,
            sample=e.number("sample", d.sample, low=0.0, high=1.0),
            request_class=e.choice("class", REQUEST_CLASSES, None),
            max_concurrency=e.integer("max_concurrency", d.max_concurrency, low=1),
            timeout=e.number("timeout", d.timeout, low=0.01),
        )
        e.done()
    m.done()
    return out


def _access_log(m: Reader) -> AccessLogSettings:
    out = AccessLogSettings(
        enabled=m.flag("enabled", True), sample=m.number("sample", 1.0, low=0.0, high=1.0)
    )
    m.done()
    return out


def _shutdown(m: Reader) -> ShutdownSettings:
    out = ShutdownSettings(
        drain_seconds=m.number("drain_seconds", ShutdownSettings().drain_seconds, low=0.0)
    )
    m.done()
    return out

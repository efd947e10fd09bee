"""Engine profiles: the YAML files under ``config/engines/`` parsed into frozen values.

A profile describes one emulated engine: its served model, its scheduling mode and the
effective timing constants fitted to a benchmark run, plus optional fault knobs. Keys use
explicit units (``_ms``, ``_us``). Unknown keys are rejected and every error is reported at
once with its key path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

# The bundled profiles: the repository's config/engines/, installed as turnout.config.engines.
ENGINES_DIR = Path(str(files("turnout.config.engines")))

SCHEDULING_MODES = ("mixed", "overlap")
SCHEDULING_POLICIES = ("fcfs", "priority")
RANK_ASSIGNMENTS = ("balanced", "random", "hash", "vllm-dp")
ROLES = ("both", "prefill", "decode")
ERROR_STATUSES = (429, 500, 503)


class ProfileError(ValueError):
    """A profile failed validation; ``errors`` lists every problem with its key path."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault knobs applied to every request (the ``X-Emulator-Fault`` header adds per request).

    ``error_rate``: share of requests answered with ``error_status`` instead of served.
    ``drop_after``: abort every stream after this many tokens (None: never).
    ``stall``: real seconds to wait before answering each request.
    ``max_waiting``: reject with 503 when this many requests already wait (None: unbounded).
    ``first_token_stall_rate``: share of requests whose first content token comes
    ``first_token_stall`` (model) seconds late: they are admitted and hold their running slot
    and KV blocks, but their prefill waits out the stall (the response headers and a chat
    stream's role chunk still go at once).
    ``slow_decode_rate``: share of requests that, after their first token, decode
    ``slow_decode_tokens`` tokens ``slow_decode_factor`` times slower (one token every that
    many steps of their rank).
    """

    error_rate: float = 0.0
    error_status: int = 503
    drop_after: int | None = None
    stall: float = 0.0
    max_waiting: int | None = None
    first_token_stall_rate: float = 0.0
    first_token_stall: float = 0.0
    slow_decode_rate: float = 0.0
    slow_decode_factor: int = 4
    slow_decode_tokens: int = 32


@dataclass(frozen=True, slots=True)
class Profile:
    """One emulated engine. Durations are effective values of a fit, not hardware truths.

    ``mixed`` scheduling (vLLM V1): each step decodes one token for every running sequence,
    then spends what is left of ``max_num_batched_tokens`` on prompt chunks; step time is
    ``step_base_ms + step_per_prefill_token_us * prefill tokens + step_per_decode_seq_ms *
    decoding sequences``. ``overlap`` scheduling: a serial prefill lane per rank
    (``prefill_base_ms + prefill_per_token_us * tokens``) runs beside a decode loop whose steps
    take ``step_base_ms + step_per_decode_seq_ms * sequences`` and emit ``tokens_per_chunk``
    tokens per sequence on average (multi-token prediction). A request reaches the scheduler
    ``frontend_ms`` plus ``frontend_per_token_us`` per prompt token (times a uniform random
    factor in [0, 2)) after it arrives: API server work such as parsing and tokenizing, which
    grows with the prompt and varies with load. That spread also keeps identical benchmark
    requests from staying phase-locked in artificial waves. A cold engine (``cold_prefills``
    above 0) prefills its first ``cold_prefills`` prompts at most ``cold_concurrency`` at a
    time over all ranks (:mod:`emulator.cold`).

    ``role`` (disaggregated serving, :mod:`emulator.kvtransfer`): a ``prefill`` engine honours
    ``kv_transfer_params.do_remote_decode`` (it holds the prompt's KV blocks for a decode
    engine, at most ``kv_hold_timeout_s``), a ``decode`` engine ``do_remote_prefill`` (it
    pulls them: ``kv_bytes_per_token`` per prompt token over a ``kv_link_gb_per_s`` link),
    ``both`` either; every engine serves ordinary requests.
    """

    name: str
    model: str = "deepseek-v4.1-flash"
    max_model_len: int = 32768
    scheduling: str = "mixed"
    scheduling_policy: str = "fcfs"
    ranks: int = 1
    rank_assignment: str = "balanced"
    dp_stats_interval_ms: float = 100.0
    api_servers: int = 1
    cold_prefills: int = 0
    cold_concurrency: int = 2
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    kv_cache_tokens: int = 1048576
    kv_block_size: int = 16
    step_base_ms: float = 3.5
    step_per_prefill_token_us: float = 70.0
    step_per_decode_seq_ms: float = 0.1
    prefill_base_ms: float = 0.0
    prefill_per_token_us: float = 82.0
    tokens_per_chunk: float = 1.0
    frontend_ms: float = 0.0
    frontend_per_token_us: float = 0.0
    natural_output_tokens: int = 256
    embedding_dim: int = 256
    role: str = "both"
    kv_bytes_per_token: int = 70272
    kv_link_gb_per_s: float = 50.0
    kv_hold_timeout_s: float = 480.0
    faults: Faults = field(default_factory=Faults)

    @property
    def kv_blocks_per_rank(self) -> int:
        """KV cache blocks each rank holds (the engine's capacity split evenly)."""
        return self.kv_cache_tokens // self.kv_block_size // self.ranks


_FIELDS = {f.name: f for f in dataclasses.fields(Profile)}
_FAULT_FIELDS = {f.name: f for f in dataclasses.fields(Faults)}


def _check_scalar(path: str, value: object, kind: str, errors: list[str]) -> Any:
    """Coerce ``value`` to the annotated kind, or record an error and return None."""
    optional = kind.endswith("| None")
    base = kind.replace("| None", "").strip()
    if value is None and optional:
        return None
    if base == "str":
        if isinstance(value, str) and value:
            return value
        errors.append(f"{path}: expected a non-empty string, got {value!r}")
    elif base == "int":
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        errors.append(f"{path}: expected a non-negative integer, got {value!r}")
    elif base == "float":
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        errors.append(f"{path}: expected a non-negative number, got {value!r}")
    return None


def _check_choices(values: dict[str, Any], errors: list[str]) -> None:
    choices = {
        "scheduling": SCHEDULING_MODES,
        "scheduling_policy": SCHEDULING_POLICIES,
        "rank_assignment": RANK_ASSIGNMENTS,
        "role": ROLES,
    }
    for key, allowed in choices.items():
        if key in values and values[key] not in allowed:
            errors.append(f"{key}: unknown {values[key]!r} (known: {', '.join(allowed)})")
    for key in ("ranks", "api_servers", "max_num_seqs", "max_num_batched_tokens", "kv_block_size",
                "cold_concurrency"):  # fmt: skip
        if values.get(key) == 0:
            errors.append(f"{key}: must be at least 1")
    if values.get("dp_stats_interval_ms", 1.0) <= 0:
        errors.append("dp_stats_interval_ms: must be above 0")
    if values.get("kv_link_gb_per_s", 1.0) <= 0:
        errors.append("kv_link_gb_per_s: must be above 0")
    if values.get("tokens_per_chunk", 1.0) < 1.0:
        errors.append("tokens_per_chunk: must be at least 1")


def profile_from_mapping(doc: Mapping[str, Any], source: str = "profile") -> Profile:
    """Validate a parsed profile document; raise :class:`ProfileError` with every problem."""
    errors: list[str] = []
    values: dict[str, Any] = {}
    for key, raw in doc.items():
        if key == "faults":
            continue
        f = _FIELDS.get(key)
        if f is None:
            errors.append(f"{key}: unknown key (known: {', '.join(sorted(_FIELDS))})")
            continue
        value = _check_scalar(key, raw, str(f.type), errors)
        if value is not None:
            values[key] = value
    _check_choices(values, errors)
    faults = _faults_from(doc.get("faults") or {}, errors)
    if "name" not in values and not any(e.startswith("name:") for e in errors):
        errors.append("name: required")
    if errors:
        raise ProfileError(source, errors)
    return Profile(faults=faults, **values)


def _faults_from(raw: object, errors: list[str]) -> Faults:
    if not isinstance(raw, Mapping):
        errors.append(f"faults: expected a mapping, got {raw!r}")
        return Faults()
    values: dict[str, Any] = {}
    for key, item in raw.items():
        f = _FAULT_FIELDS.get(key)
        if f is None:
            known = ", ".join(sorted(_FAULT_FIELDS))
            errors.append(f"faults.{key}: unknown key (known: {known})")
            continue
        value = _check_scalar(f"faults.{key}", item, str(f.type), errors)
        if value is not None or item is None:
            values[key] = value
    for rate in ("error_rate", "first_token_stall_rate", "slow_decode_rate"):
        if values.get(rate, 0.0) > 1.0:
            errors.append(f"faults.{rate}: must be between 0 and 1")
    if values.get("slow_decode_factor") == 0:
        errors.append("faults.slow_decode_factor: must be at least 1")
    if "error_status" in values and values["error_status"] not in ERROR_STATUSES:
        errors.append(f"faults.error_status: must be one of {ERROR_STATUSES}")
    return Faults(**values)


def load_profile(name_or_path: str, overrides: Mapping[str, Any] | None = None) -> Profile:
    """Load ``config/engines/NAME.yaml`` or a YAML file path, then apply ``overrides``.

    ``overrides`` use the profile's keys; ``faults.KEY`` addresses a fault knob.
    """
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = ENGINES_DIR / f"{name_or_path}.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        known = ", ".join(sorted(p.stem for p in ENGINES_DIR.glob("*.yaml")))
        raise ProfileError(str(path), [f"cannot read ({exc.strerror}); known: {known}"]) from exc
    if not isinstance(doc, dict):
        raise ProfileError(str(path), ["expected a mapping at the top level"])
    for key, value in (overrides or {}).items():
        if key.startswith("faults."):
            doc.setdefault("faults", {})[key.removeprefix("faults.")] = value
        else:
            doc[key] = value
    return profile_from_mapping(doc, str(path))

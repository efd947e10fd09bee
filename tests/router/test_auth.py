"""router.control.auth: key sources, constant-time lookup, model lists, buckets, concurrency."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from policies.types import RequestInfo
from router.config.model import AnonymousLimits, ApiKeySpec, ConfigError
from router.control.auth import Gate, exposure_warning
from router.control.quota import Limits, QuotaTable
from router.server.errors import RouterError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def req(model: str = "m", prompt: int = 10, max_tokens: int | None = 20, n: int = 1) -> RequestInfo:
    return RequestInfo(
        "r", "chat", model, "interactive", prompt_tokens=prompt, max_tokens=max_tokens, choices=n
    )


CTX = 32_768  # the context length the tests' model reports


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_key_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_AUTH_TEST_KEY", "from-env")
    (tmp_path / "key").write_text("from-file\n")
    gate = Gate(
        [
            ApiKeySpec("e", env="SY_AUTH_TEST_KEY"),
            ApiKeySpec("f", file=str(tmp_path / "key")),
            ApiKeySpec("h", sha256=sha("from-hash")),
        ],
        required=True,
    )
    for key, name in (("from-env", "e"), ("from-file", "f"), ("from-hash", "h")):
        tenant = gate.identify(bearer(key))
        assert tenant is not None and tenant.spec.name == name
    for headers in ({}, bearer("nope"), {"Authorization": "Basic from-env"}):
        with pytest.raises(RouterError) as exc:
            gate.identify(headers)
        assert exc.value.status == 401


def test_optional_keys_let_strangers_through() -> None:
    gate = Gate([ApiKeySpec("h", sha256=sha("k"), request_class="batch")], required=False)
    assert gate.identify(bearer("other")) is None
    assert gate.identify({}) is None
    tenant = gate.identify(bearer("k"))
    assert tenant is not None and tenant.spec.request_class == "batch"
    gate.check_admin({}, "127.0.0.1")  # keys not required: admin endpoints for loopback only
    gate.check_admin({}, "::1")
    with pytest.raises(RouterError) as exc:
        gate.check_admin(bearer("k"), "192.0.2.7")
    assert exc.value.status == 403


def test_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        Gate([ApiKeySpec("f", file=str(tmp_path / "missing"))], required=True)
    assert exc.value.errors[0][0] == "api_keys[0].file"


def test_required_keys_all_unset_let_nobody_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SY_AUTH_TEST_UNSET", raising=False)
    gate = Gate([ApiKeySpec("e", env="SY_AUTH_TEST_UNSET")], required=True)
    for headers in ({}, bearer(""), bearer("anything")):
        with pytest.raises(RouterError) as exc:
            gate.identify(headers)
        assert exc.value.status == 401


def test_admin_key() -> None:
    gate = Gate(
        [ApiKeySpec("ops", sha256=sha("a"), admin=True), ApiKeySpec("u", sha256=sha("u"))],
        required=True,
    )
    gate.check_admin(bearer("a"), "192.0.2.7")
    with pytest.raises(RouterError) as exc:
        gate.check_admin(bearer("u"), "127.0.0.1")
    assert exc.value.status == 403
    with pytest.raises(RouterError) as exc:
        gate.check_admin({}, "127.0.0.1")
    assert exc.value.status == 401


@pytest.mark.parametrize(
    ("protect_metrics", "path", "admin"),
    [
        (False, "/turnout/backends", True),
        (False, "/turnout/reload", True),
        (False, "/turnout/policies", False),  # any caller the request path takes (401 else)
        (False, "/metrics", False),
        (True, "/metrics", True),
        (True, "/health", False),
        (True, "/ready", False),
        (True, "/v1/chat/completions", False),
    ],
)
def test_which_paths_need_the_admin_key(protect_metrics: bool, path: str, admin: bool) -> None:
    gate = Gate([], required=True, protect_metrics=protect_metrics)
    assert gate.needs_admin(path) is admin


async def test_model_list_is_403() -> None:
    gate = Gate([ApiKeySpec("u", sha256=sha("u"), models=("m",))], required=True)
    tenant = gate.identify(bearer("u"))
    assert await gate.admit(tenant, req("m"), CTX) is not None
    with pytest.raises(RouterError) as exc:
        await gate.admit(tenant, req("other"), CTX)
    assert (exc.value.status, exc.value.param) == (403, "model")


async def test_concurrency_cap_and_release() -> None:
    gate = Gate([ApiKeySpec("u", sha256=sha("u"), max_concurrency=2)], required=True)
    tenant = gate.identify(bearer("u"))
    leases = [await gate.admit(tenant, req(), CTX) for _ in range(2)]
    with pytest.raises(RouterError) as exc:
        await gate.admit(tenant, req(), CTX)
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "1"
    lease = leases[0]
    assert lease is not None
    lease.release(0)  # refused upstream: the whole charge comes back
    assert await gate.admit(tenant, req(), CTX) is not None


async def test_requests_per_minute_bucket_with_retry_after() -> None:
    clock = Clock()
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"), requests_per_minute=3)],
        required=True,
        store=QuotaTable.private(clock),
    )
    tenant = gate.identify(bearer("u"))
    for _ in range(3):
        await gate.admit(tenant, req(), CTX)
    with pytest.raises(RouterError) as exc:
        await gate.admit(tenant, req(), CTX)
    assert exc.value.status == 429
    assert exc.value.headers["Retry-After"] == "20"  # one request refills in 60/3 s
    clock.now += 20
    await gate.admit(tenant, req(), CTX)


async def test_tokens_per_minute_settles_with_usage() -> None:
    clock = Clock()
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"), tokens_per_minute=100)],
        required=True,
        store=QuotaTable.private(clock),
    )
    tenant = gate.identify(bearer("u"))
    lease = await gate.admit(tenant, req(prompt=30, max_tokens=50), CTX)  # charged 80
    assert lease is not None
    with pytest.raises(RouterError):
        await gate.admit(tenant, req(prompt=30, max_tokens=50), CTX)
    lease.release(15)  # really used 15: 65 of the 80 come back, 85 left
    assert await gate.admit(tenant, req(prompt=30, max_tokens=50), CTX) is not None


def test_bucket_refills_continuously_and_caps() -> None:
    clock = Clock()
    table = QuotaTable.private(clock)
    limits = Limits(tokens_per_minute=60)
    assert isinstance(table.take("q", limits, 60), QuotaTable)
    refusal = table.check("q", limits, 1)
    assert refusal is not None and refusal.kind == "tokens" and refusal.wait == pytest.approx(1.0)
    clock.now += 0.5
    refusal = table.check("q", limits, 1)
    assert refusal is not None and refusal.wait == pytest.approx(0.5)
    clock.now += 1000
    assert table.check("q", limits, 60) is None
    assert table.check("q", limits, 600) is None  # larger than the bucket: needs it full, not more
    assert table.usage("q", limits)[1] == 60


def test_exposure_warning() -> None:
    assert exposure_warning("127.0.0.1", False) is None
    assert exposure_warning("::1", False) is None
    assert exposure_warning("0.0.0.0", True) is None
    warning = exposure_warning("0.0.0.0", False)
    assert warning is not None and "require_api_key" in warning


async def test_a_hostile_max_tokens_is_charged_no_more_than_the_context_and_retry_is_bounded() -> (
    None
):
    """`max_tokens: 2**63-1` once locked a key out for ~10^17 s; now the charge stops at the
    context length (and the bucket), the engine's 400 refunds it, and Retry-After never
    exceeds the bucket's minute."""
    clock = Clock()
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"), tokens_per_minute=2000)],
        required=True,
        store=QuotaTable.private(clock),
    )
    tenant = gate.identify(bearer("u"))
    lease = await gate.admit(tenant, req(max_tokens=9223372036854775807), CTX)
    assert lease is not None and lease.charged == 2000  # the whole bucket, not 9e18
    with pytest.raises(RouterError) as exc:
        await gate.admit(tenant, req(), CTX)
    assert exc.value.status == 429 and int(exc.value.headers["Retry-After"]) <= 60
    lease.release(0)  # the engine said 400: nothing was generated
    assert await gate.admit(tenant, req(), CTX) is not None


async def test_a_usage_figure_past_the_context_is_a_lie_and_is_capped() -> None:
    clock = Clock()
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"), tokens_per_minute=1000)],
        required=True,
        store=QuotaTable.private(clock),
    )
    tenant = gate.identify(bearer("u"))
    lease = await gate.admit(tenant, req(prompt=10, max_tokens=10), 100)
    assert lease is not None
    lease.release(10**8)  # a backend claims 100 M tokens: settled at the context, 100
    clock.now += 6  # 100 tokens refill in 6 s
    assert await gate.admit(tenant, req(prompt=500, max_tokens=500), CTX) is not None


async def test_n_choices_are_charged_and_bounded_per_choice() -> None:
    """Each of n choices may use a whole context: n=8 of 100 tokens, with a context of 200,
    is charged and settled at 810, not at one context (200)."""
    table = QuotaTable.private(Clock())
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"), tokens_per_minute=1000)], required=True, store=table
    )
    tenant = gate.identify(bearer("u"))
    assert tenant is not None
    lease = await gate.admit(tenant, req(prompt=10, max_tokens=100, n=8), 200)
    assert lease is not None and lease.charged == 810
    lease.release(810)  # honest usage: within 8 contexts
    assert table.usage(tenant.capture_id, tenant.limits)[1] == 1000 - 810
    lease = await gate.admit(tenant, req(prompt=0, max_tokens=0), 200)
    assert lease is not None
    lease.release(10**6)  # a lie past one choice's context: settled at 200
    assert table.usage(tenant.capture_id, tenant.limits)[1] == 1000 - 810 - 200


async def test_a_window_spent_is_refused_before_anything_is_read() -> None:
    clock = Clock()
    specs = [
        ApiKeySpec("r", sha256=sha("r"), requests_per_minute=1),
        ApiKeySpec("t", sha256=sha("t"), tokens_per_minute=100),
        ApiKeySpec("c", sha256=sha("c"), max_concurrency=1),
    ]
    gate = Gate(specs, required=True, store=QuotaTable.private(clock))
    by_rate, by_tokens, by_slots = (gate.identify(bearer(k)) for k in "rtc")
    for tenant in (by_rate, by_tokens, by_slots):
        gate.refuse_early(tenant)  # nothing spent yet
        lease = await gate.admit(tenant, req(prompt=100, max_tokens=100), CTX)
        assert lease is not None
        if tenant is not by_slots:
            lease.release(200)  # used 200 of a 100-a-minute bucket: in debt
    for tenant, why in ((by_rate, "requests"), (by_tokens, "tokens"), (by_slots, "open")):
        with pytest.raises(RouterError) as exc:
            gate.refuse_early(tenant)
        assert exc.value.status == 429 and why in exc.value.message
    gate.refuse_early(by_tokens, tokens=False)  # a tokenizer call spends no tokens
    # ...nor does admitting it need any: it is charged nothing.
    utility = RequestInfo("r", "tokenize", "m", "interactive", max_tokens=0)
    lease = await gate.admit(by_tokens, utility, 0)
    assert lease is not None and lease.charged == 0


async def test_anonymous_traffic_has_its_own_limits() -> None:
    gate = Gate(
        [ApiKeySpec("u", sha256=sha("u"))],
        required=False,
        anonymous=AnonymousLimits(max_concurrency=1),
    )
    assert await gate.admit(None, req(), CTX) is not None
    with pytest.raises(RouterError) as exc:
        await gate.admit(None, req(), CTX)
    assert exc.value.status == 429 and "anonymous" in exc.value.message
    assert (
        await gate.admit(gate.identify(bearer("u")), req(), CTX) is not None
    )  # a key: its own quota
    assert await Gate([], required=False).admit(None, req(), CTX) is None  # no limits configured


async def test_a_reload_keeps_every_quota_and_in_flight_count() -> None:
    clock = Clock()
    spec = ApiKeySpec("u", sha256=sha("u"), requests_per_minute=2, max_concurrency=5)
    table = QuotaTable.private(clock)
    old = Gate([spec], required=True, store=table)
    held = await old.admit(old.identify(bearer("u")), req(), CTX)
    await old.admit(old.identify(bearer("u")), req(), CTX)
    renamed = ApiKeySpec("renamed", sha256=sha("u"), requests_per_minute=2, max_concurrency=1)
    new = Gate([renamed], required=True, store=old.store)  # as a reload builds it
    tenant = new.identify(bearer("u"))
    with pytest.raises(RouterError) as exc:  # the minute's two requests are still spent
        await new.admit(tenant, req(), CTX)
    assert exc.value.status == 429
    clock.now += 60
    with pytest.raises(RouterError):  # and two are still open, over the new cap of one
        await new.admit(tenant, req(), CTX)
    assert held is not None
    held.release(0)  # an old lease releases into the same quota
    assert tenant is not None and table.usage(tenant.capture_id, tenant.limits)[2] == 1


async def test_error_messages_never_name_the_key() -> None:
    gate = Gate(
        [ApiKeySpec("team-secret-name", sha256=sha("u"), models=("m",), max_concurrency=1)],
        required=True,
    )
    tenant = gate.identify(bearer("u"))
    await gate.admit(tenant, req(), CTX)
    for model in ("other", "m"):
        with pytest.raises(RouterError) as exc:
            await gate.admit(tenant, req(model), CTX)
        assert "team-secret-name" not in exc.value.message


def test_a_key_file_that_is_not_utf8_is_a_config_error_without_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"sk-\xff\xfesecret")
    with pytest.raises(ConfigError) as exc:
        Gate([ApiKeySpec("f", file=str(path))], required=True)
    [(where, message)] = exc.value.errors
    assert where == "api_keys[0].file" and message.endswith("is not UTF-8 text")
    assert "\\xff" not in message and "secret" not in message

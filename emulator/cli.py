"""``turnout emulator``: serve one emulated engine over HTTP.

    turnout emulator --profile vllm|deepinfer|PATH.yaml [--host 127.0.0.1] [--port 8000]
                     [--model NAME] [--time-scale X] [--seed N] [--set KEY=VALUE]...
                     [--error-rate R] [--error-status 429|500|503] [--drop-after K] [--stall T]
                     [--max-waiting N] [--ssl-certfile PEM --ssl-keyfile PEM [--ssl-ca-certs PEM
                     --ssl-cert-reqs 2]]

``--set`` overrides any profile key (``--set kv_cache_tokens=4096``, ``--set
scheduling_policy=priority``); the fault flags override the profile's ``faults``. Once the
socket is bound it prints ``emulator listening on http://HOST:PORT`` (``https`` with TLS) and
flushes. The ``--ssl-*`` flags are vLLM's: serve HTTPS, and with ``--ssl-cert-reqs 2`` demand
a client certificate signed by ``--ssl-ca-certs`` (mutual TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import uvloop
import yaml
from aiohttp import web

from emulator.profiles import ProfileError, load_profile
from emulator.server import ServerOptions, build_app


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turnout emulator", description="Emulated LLM inference engine."
    )
    p.add_argument(
        "--profile",
        required=True,
        help="name of a bundled profile (vllm, deepinfer) or a YAML path",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 binds a free port")
    p.add_argument("--model", help="served model name (default: the profile's)")
    p.add_argument("--time-scale", type=float, default=1.0, help="divide modelled durations by X")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile key (faults.KEY for fault knobs)")  # fmt: skip
    p.add_argument("--error-rate", type=float, help="share of requests answered with an error")
    p.add_argument("--error-status", type=int, help="status of those errors (429, 500, 503)")
    p.add_argument("--drop-after", type=int, help="abort every stream after K tokens")
    p.add_argument("--stall", type=float, help="seconds to wait before answering")
    p.add_argument("--max-waiting", type=int, help="503 when this many requests already wait")
    p.add_argument("--ssl-certfile", help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--ssl-keyfile", help="the certificate's PEM key")
    p.add_argument("--ssl-ca-certs", help="PEM CA bundle that verifies client certificates")
    p.add_argument("--ssl-cert-reqs", type=int, default=0, choices=(0, 1, 2),
                   help="client certificates: 0 none, 1 optional, 2 required")  # fmt: skip
    return p


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.ssl_certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    if args.ssl_ca_certs is not None:
        context.load_verify_locations(cafile=args.ssl_ca_certs)
    context.verify_mode = ssl.VerifyMode(args.ssl_cert_reqs)
    return context


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"emulator: --set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    for flag in ("error_rate", "error_status", "drop_after", "stall", "max_waiting"):
        value = getattr(args, flag)
        if value is not None:
            out[f"faults.{flag}"] = value
    return out


async def _serve(options: ServerOptions, host: str, port: int, tls: ssl.SSLContext | None) -> None:
    # In-flight streams are cut after a short grace on shutdown: an emulator need not drain.
    runner = web.AppRunner(
        build_app(options), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = runner.addresses[0]
    scheme = "https" if tls is not None else "http"
    shown = f"[{host}]" if ":" in host else host
    print(f"emulator listening on {scheme}://{shown}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load the profile and serve until SIGINT/SIGTERM."""
    args = _parser().parse_args(argv)
    if args.time_scale <= 0:
        print("emulator: --time-scale must be positive", file=sys.stderr)
        return 2
    try:
        profile = load_profile(args.profile, _overrides(args))
    except ProfileError as exc:
        print(f"emulator: invalid profile {exc}", file=sys.stderr)
        return 2
    options = ServerOptions(
        profile=profile,
        model=args.model or profile.model,
        time_scale=args.time_scale,
        seed=args.seed,
    )
    try:
        tls = _tls(args)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        print(f"emulator: cannot load the TLS files: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(_serve(options, args.host, args.port, tls))
    except OSError as exc:  # port taken, address not available
        print(
            f"emulator: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr
        )
        return 1
    return 0

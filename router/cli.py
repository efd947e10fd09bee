"""The router's subcommands of ``turnout`` (turnout/cli.py dispatches here).

    turnout serve [--config PATH] [--host HOST] [--port PORT] [--workers N]
    turnout check-config PATH
    turnout print-default-config

``serve`` without ``--config`` uses the embedded default (config/router.yaml, installed as
``turnout.config``), which starts two emulated engines as child processes. Once listening it
prints ``turnout listening on http://HOST:PORT`` and flushes. With ``--workers N`` N processes
share the port through SO_REUSEPORT; they share their backend load, and any one's /metrics
shows them all.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import NoReturn

import uvloop

from router.app import RELOADER, STATE, build_app, build_policies, listen_socket, serve
from router.backends.fleet_load import RouterName
from router.batch.service import StoreBusy, claim_store, store_url
from router.config.backends import shown_url
from router.config.batch import BatchSettings
from router.config.model import ConfigError, ListenSettings, RouterConfig
from router.config.parse import read_config
from router.control.auth import Gate, exposure_warning
from router.observe.metrics import Metrics
from router.observe.tracing import tracing_from_env
from router.server.children import Children
from router.server.descriptors import raise_soft_limit
from router.workers import Sharing, supervise

log = logging.getLogger("router")
READY = "turnout listening on "
REFRESH_SECONDS = 1.0


def default_config_path() -> Path:
    """The embedded default, shipped as package data of ``turnout.config``."""
    return Path(str(files("turnout.config").joinpath("router.yaml")))


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turnout serve",
        description="Run the router.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="YAML config (default: the embedded default)")
    p.add_argument("--host", help="listen address (overrides listen.host)")
    p.add_argument("--port", type=int, help="listen port, 0 for a free one (overrides listen.port)")
    p.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    return p


def check_main(argv: list[str]) -> int:
    """``turnout check-config PATH``."""
    p = argparse.ArgumentParser(
        prog="turnout check-config", description="Validate a config; exit 2 listing every error."
    )
    p.add_argument("path", type=Path)
    return check_config(p.parse_args(argv).path)


def print_default_main(argv: list[str]) -> int:
    """``turnout print-default-config``: the embedded default, to start one's own from."""
    argparse.ArgumentParser(
        prog="turnout print-default-config",
        description="Print the embedded default config (turnout print-default-config > my.yaml).",
    ).parse_args(argv)
    sys.stdout.write(default_config_path().read_text(encoding="utf-8"))
    return 0


def load_checked(path: Path) -> RouterConfig:
    """Load ``path``, build its policies and resolve its API keys; raises ConfigError with
    every error of the three at once."""
    errors: list[tuple[str, str]] = []
    config = read_config(path, errors)
    try:
        build_policies(config)
    except ConfigError as exc:
        errors.extend(exc.errors)
    try:
        Gate(config.api_keys, required=config.require_api_key)  # key files readable, keys set
    except ConfigError as exc:
        errors.extend(exc.errors)
    if errors:
        raise ConfigError(errors)
    return config


def check_config(path: Path) -> int:
    try:
        config = load_checked(path)
    except ConfigError as exc:
        _print_errors(exc)
        print(f"{path}: {len(exc.errors)} error(s)", file=sys.stderr)
        return 2
    for key, message in env_warnings(config):
        print(f"warning: {key}: {message}", file=sys.stderr)
    print(f"{path}: ok ({len(config.backends)} backends, {len(config.policies)} policies)")
    return 0


def env_warnings(config: RouterConfig) -> list[tuple[str, str]]:
    """Named environment variables that are not set here (valid config, but likely a mistake)."""
    out = []
    for i, b in enumerate(config.backends):
        if b.api_key_env and not os.environ.get(b.api_key_env):
            out.append((f"backends[{i}].api_key_env", f"${b.api_key_env} is not set"))
    for i, k in enumerate(config.api_keys):
        if k.env and not os.environ.get(k.env):
            out.append((f"api_keys[{i}].env", f"${k.env} is not set; this key matches nothing"))
    return out


def serve_main(argv: list[str]) -> int:
    """``turnout serve``."""
    args = _serve_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    path = args.config or default_config_path()
    try:
        config = load_checked(path)
    except ConfigError as exc:
        _print_errors(exc)
        return 2
    listen = replace(
        config.listen,
        host=args.host if args.host is not None else config.listen.host,
        port=args.port if args.port is not None else config.listen.port,
    )
    if args.workers < 1:
        print("turnout serve: --workers must be at least 1", file=sys.stderr)
        return 2
    try:  # bind before starting emulators, so a busy port fails fast
        sock = listen_socket(listen.host, listen.port, reuse_port=args.workers > 1)
    except OSError as exc:
        print(
            f"turnout serve: cannot listen on {listen.host}:{listen.port}: {exc}", file=sys.stderr
        )
        return 1
    if config.batch is not None and not _claim_batch_store(config.batch):
        sock.close()
        return 1
    for key, message in env_warnings(config):
        log.warning("%s: %s", key, message)
    # Before the emulators and workers start, so they inherit it.
    before, after = raise_soft_limit()
    if after != before:
        log.info("file descriptor limit raised from %d to %d", before, after)
    if (exposed := exposure_warning(listen.host, config.require_api_key)) is not None:
        log.warning("%s", exposed)
    _exit_now(_serve(config, listen, sock, args.workers, path))


def _claim_batch_store(settings: BatchSettings) -> bool:
    """Take the Batch API's store for this router (its lock lives as long as the process,
    workers included) and say where it is; False, said why, when it cannot be had."""
    url = store_url(settings)
    try:
        claim_store(url)
    except StoreBusy as exc:
        print(f"turnout serve: {exc}", file=sys.stderr)
        return False
    except OSError as exc:
        print(f"turnout serve: cannot make the batch store's directory: {exc}", file=sys.stderr)
        return False
    where = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else shown_url(url)
    log.info("batch API on (/v1/files, /v1/batches): its store is %s", where)
    return True


def _serve(
    config: RouterConfig, listen: ListenSettings, sock: socket.socket, workers: int, path: Path
) -> int:
    children = Children()
    try:
        config = children.start(replace(config, listen=listen))
        if workers == 1:
            uvloop.run(_worker(config, sock, _announce, path))
            return 0
        return supervise(config, sock, workers, path, _worker, _announce)
    except RuntimeError as exc:  # an emulator child did not come up
        print(f"turnout serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        children.stop()
        sock.close()


def _exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown of its modules and heap. Everything that
    needed closing is closed (the drain, the capture, the workers reaped, the emulators
    stopped), and on a loaded 2-core machine that teardown took 0.6 s of the 1 s that
    SIGTERM's bound (drain_seconds + 1 s) leaves."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _print_errors(exc: ConfigError) -> None:
    for key, message in exc.errors:
        print(f"{key}: {message}" if key else message, file=sys.stderr)


def _announce(url: str) -> None:
    print(READY + url, flush=True)


async def _worker(
    config: RouterConfig,
    sock: socket.socket,
    ready: Callable[[str], None],
    path: Path,
    sharing: Sharing | None = None,
    index: int = 0,
) -> None:
    """Serve until SIGINT/SIGTERM, then drain and shut down; SIGHUP reloads ``path``.

    ``ready(url)`` once listening. ``sharing``: worker ``index`` of several.
    """
    if sharing is None:
        app = build_app(config, config_path=path)
    else:
        metrics = Metrics(workers_dir=sharing.metrics_dir)
        app = build_app(
            config,
            metrics=metrics,
            config_path=path,
            shared=sharing.load.row(index),
            quotas=sharing.quotas.table(index),
            fairness=sharing.fairness.ledger(index),
            placements=sharing.placements.ring(index),
            router=RouterName(sharing.router_id, publishes=index == 0),
            tracing=tracing_from_env(warn=index == 0),  # the router says it once, not N times
        )
        refresher = asyncio.create_task(_refresh(metrics))
    served = await serve(app, sock)
    # Everything built so far lives as long as the process: keep it out of the collector's
    # scans, so collections triggered on the hot path stay short.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app[RELOADER].on_signal)
    ready(served.url)
    log.info("serving %s (pid %d)", served.url, os.getpid())
    try:
        await stop.wait()
    finally:
        drain = app[STATE].drain
        seconds = app[STATE].config.shutdown.drain_seconds
        log.info("draining %d open requests for up to %g s", drain.open, seconds)
        if cut := await drain.run(served.runner, seconds):
            log.info("cut %d requests at the drain deadline", cut)
        if sharing is not None:
            refresher.cancel()


async def _refresh(metrics: Metrics) -> None:
    """Keep this worker's live gauges fresh for the scrapes its siblings answer."""
    while True:
        metrics.refresh()
        await asyncio.sleep(REFRESH_SECONDS)

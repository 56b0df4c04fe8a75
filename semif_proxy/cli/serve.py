"""`semif-proxy serve` (the container's entrypoint runs it) and `selfcheck`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from semif_proxy.logs import configure_logging
from semif_proxy.settings import Settings, SettingsError, load_settings

log = logging.getLogger("semif_proxy")


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    try:
        return load_settings(model=args.model, **extra)
    except SettingsError as exc:
        sys.stderr.write(f"semif-proxy: configuration error: {exc}\n")
        raise SystemExit(2) from None


def _log_listening(settings: Settings) -> None:
    """The start-up line, once the port is bound: where it listens, whether a key guards it and
    whether /invocations is open. Never the key itself."""
    keyed = bool(settings.api_key)
    public = not keyed or settings.invocations_public
    if not keyed:
        guard = "no API key: every route is open"
    elif settings.invocations_public:
        guard = "API key set; /invocations is public (SEMIF_INVOCATIONS_PUBLIC: SageMaker's edge)"
    else:
        guard = "API key set; /invocations needs it too"
    log.info(
        f"listening on http://{settings.host}:{settings.port}; {guard}",
        extra={
            "event": "listening",
            "host": settings.host,
            "port": settings.port,
            "api_key_set": keyed,
            "invocations_public": public,
        },
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from semif_proxy.http.app import create_app
    from semif_proxy.http.keys import STARTUP

    # Configured before the settings are read, so that their own warnings (an ignored
    # SM_LLAMA_CPP_HOST) are JSON lines too; again once the level is known.
    configure_logging()
    settings = _settings(args, port=args.port, host=args.host)
    configure_logging(settings.log_level)
    log.info("settings", extra={"event": "settings", "settings": settings.public_dict()})
    from semif_proxy.model import gpu_memory

    # On a GPU: both processes' weights and KV caches must fit, or the start stops here with
    # the advice (exit 2) instead of an out-of-memory crash minutes later.
    gpu_memory.startup_check(settings)
    from semif_proxy import selfcheck

    try:
        report = selfcheck.run(llama_server=settings.llama_server_binary)
        log.info("selfcheck", extra={"event": "selfcheck", **report})
    except selfcheck.SelfCheckError as exc:
        log.warning("selfcheck failed", extra={"event": "selfcheck", "error": str(exc)})
    # A background load that fails stops the process (SageMaker then sees the container exit).
    app = create_app(settings, on_fatal=lambda: os.kill(os.getpid(), signal.SIGTERM))
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        shutdown_timeout=settings.shutdown_grace,
        print=lambda _banner: _log_listening(settings),  # called once the port is bound
        access_log=None,
        handle_signals=True,
        # A client that hangs up cancels its handler: its queued or running engine job stops
        # and its upstream chat call is closed (llama-server then stops generating).
        handler_cancellation=True,
    )
    errors = app[STARTUP].errors
    for message in errors:
        sys.stderr.write(f"semif-proxy: {message}\n")
    return 3 if errors else 0


def cmd_selfcheck(args: argparse.Namespace) -> int:
    from semif_proxy import selfcheck

    try:
        report = selfcheck.run(
            require_system_libllama=args.require_system_libllama, llama_server=args.llama_server
        )
    except selfcheck.SelfCheckError as exc:
        sys.stderr.write(f"semif-proxy selfcheck: FAILED: {exc}\n")
        return 1
    sys.stdout.write(json.dumps({"selfcheck": "ok", **report}) + "\n")
    return 0

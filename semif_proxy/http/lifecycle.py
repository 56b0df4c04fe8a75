"""What the application starts and stops (its aiohttp `cleanup_ctx` entries): the weights'
layout for every process, the decision engine, the supervised llama-server children (one, or
two under CPU sharing dynamic) and the HTTP client session to them. The slow steps run in the
background, so the port opens at once and /ping says 503 until they are ready; a
load that fails records why and calls the start-up's `on_fatal` (the CLI ends the process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from semif_proxy.cpu.plan import memory_room, private_bytes, second_server_fits
from semif_proxy.engine import native
from semif_proxy.engine.layout import Layout, resolve
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.http.keys import (
    CPU_POLICY,
    ENGINE,
    LAYOUT,
    LLAMA,
    LLAMA_SECOND,
    SETTINGS,
    STARTUP,
    THREAD_PLAN,
    UPSTREAM,
    EngineSlot,
    LayoutSlot,
)
from semif_proxy.llama_server.args import with_defaults
from semif_proxy.llama_server.supervisor import LlamaServer, LlamaServerError, Supervision
from semif_proxy.settings import repack_choice

log = logging.getLogger("semif_proxy.app")  # the name its log lines have always carried


def _fatal(app: web.Application, what: str, exc: BaseException) -> None:
    message = f"{what} failed to start: {exc}"
    log.error(message, extra={"event": "startup_failed", "error": str(exc)})
    app[STARTUP].errors.append(message)
    app[STARTUP].on_fatal()


async def _decide_layout(app: web.Application) -> None:
    """SEMIF_REPACK for the engine and every llama-server, before either loads: with `auto`,
    both layouts timed in throw-away children (engine/layout.py) unless a measurement of this
    build, model, CPU and thread count is kept. Nothing else computes meanwhile."""
    settings, plan = app[SETTINGS], app[THREAD_PLAN]
    servers = (1 + int(app[CPU_POLICY].second_server)) if settings.chat else 0
    processes = int(settings.decisions) + servers  # each holds its own copy if repacked
    threads = plan.engine if settings.decisions else (plan.llama_server or plan.engine)
    slot = app[LAYOUT]
    try:
        slot.layout = await resolve(settings, threads, processes, memory_room())
    except asyncio.CancelledError:
        return  # stopping: `decided` is set with no layout, and nothing loads
    except Exception as exc:  # the rule still decides: a failed measurement stops nothing
        log.exception("the weights' layout could not be measured")
        rule = repack_choice(settings.repack)
        slot.layout = Layout(rule._replace(why=f"{rule.why} (not measured: {exc})"))
    finally:
        slot.decided.set()
    layout = slot.layout.as_dict()
    log.info(
        f"weights layout: repack {'on' if layout['on'] else 'off'}: {layout['why']}",
        extra={"event": "weights_layout", "setting": settings.repack, **layout},
    )


async def layout_ctx(app: web.Application) -> AsyncIterator[None]:
    app[LAYOUT] = LayoutSlot()
    task = asyncio.create_task(_decide_layout(app))
    app[LAYOUT].task = task
    yield
    await stop_measuring(app)


async def stop_measuring(app: web.Application) -> None:
    """On shutdown, before the contexts are torn down (the engine's waits for the layout): a
    measurement in progress is cancelled, its child killed; nothing loads after it."""
    task = app[LAYOUT].task
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _load_engine(app: web.Application) -> None:
    try:
        await app[LAYOUT].decided.wait()
        layout = app[LAYOUT].layout
        if layout is None:  # the server is stopping before the layout was decided
            return
        engine = await DecisionEngine.start(app[SETTINGS], app[THREAD_PLAN].engine, layout)
    except Exception as exc:  # any load failure ends the process: nothing to serve
        _fatal(app, "the decision engine", exc)
        return
    finally:
        app[ENGINE].load_over.set()
    app[ENGINE].engine = engine
    app[CPU_POLICY].attach(engine=engine)
    # How a question that names none is read (SEMIF_READOUT, _NORMALIZATION, _BIAS_CORRECTION),
    # said once.
    settings = app[SETTINGS]
    defaults = {
        "default_readout": settings.readout.describe(),
        "default_normalization": settings.normalization.describe(),
        "default_bias_correction": settings.bias_correction.describe(),
    }
    extra = {"event": "engine_ready", **engine.model_info, **defaults}
    log.info("decision engine ready", extra=extra)


async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
    # Loaded in the background: the port opens at once and /ping says 503 until it is ready.
    app[ENGINE] = EngineSlot()
    task = asyncio.create_task(_load_engine(app)) if app[SETTINGS].decisions else None
    yield
    if task is not None:
        await asyncio.shield(task)  # a load in progress cannot be interrupted; let it end
    engine = app[ENGINE].engine
    if engine is not None:
        await asyncio.get_running_loop().run_in_executor(None, engine.close)


async def _start_llama(app: web.Application, server: LlamaServer, second: bool) -> bool:
    """The second llama-server's failure is not fatal: chat goes to the main one."""
    try:
        await server.start()
        return True
    except Exception as exc:
        if not second:
            _fatal(app, "llama-server", exc)
            return False
        log.error(
            "the second llama-server failed to start; chat uses the main one through the gate",
            extra={"event": "llama_server_split_failed", "error": str(exc)},
        )
        app[STARTUP].second_not_started = f"it failed to start: {exc}"
        return False


async def _after_the_engine(app: web.Application) -> bool:
    """On the CPU (sharing gate or dynamic: the cores go to one of the two at a time) the main
    llama-server starts once the engine has loaded. Side by side, both loads computed at once
    on the same cores and ggml's threads of each spun waiting for threads the other had taken:
    with SmolLM2 on 2 cores the engine's self-check took 11.4 s instead of 1.1 s, llama-server's
    load 10.5 s instead of 0.1 s, and /ping said 200 after 12.2 s. The engine goes first so
    that decisions are served while chat still loads (a large model's llama-server may take
    minutes). Meanwhile the server's state says "waiting" in /ping and /health. False: a
    start-up failure (the engine's) is ending the process, nothing to start."""
    if not app[SETTINGS].decisions or app[THREAD_PLAN].sharing not in ("gate", "dynamic"):
        return True
    server = app[LLAMA]
    if server is not None:
        server.state = "waiting"
    await app[ENGINE].load_over.wait()
    if server is not None and server.state == "waiting":
        server.state = "stopped"  # start() says "starting" from here on
    return not app[STARTUP].errors


async def _start_all(app: web.Application, servers: list[LlamaServer]) -> None:
    """The main llama-server first (after the engine, on the CPU); the second one once the main
    one is healthy and the engine loaded (side by side, each load would slow the others and
    /ping would say 200 later), and only if the memory left holds it."""
    main, *rest = servers
    main.state = "waiting"  # for the layout (then, on the CPU, for the engine)
    await app[LAYOUT].decided.wait()
    layout = app[LAYOUT].layout
    if layout is None:  # the server is stopping before the layout was decided
        return
    main.state = "stopped"  # start() says "starting" from here on
    repack = layout.choice.on
    settings, plan = app[SETTINGS], app[THREAD_PLAN]
    # Weight repacking as the engine loads: off, every process reads the one mmap'ed copy.
    main.extra_args = with_defaults(settings.llama_server_args, plan.llama_server, repack)
    for split in rest:
        split.extra_args = with_defaults(
            settings.llama_server_args, plan.llama_server_split, repack
        )
    if not await _after_the_engine(app):
        return
    if not await _start_llama(app, main, second=False) or not rest:
        return
    if app[SETTINGS].decisions:
        await app[ENGINE].load_over.wait()  # the engine's own load: its memory counts too
    if app[STARTUP].errors:
        return
    room, need = memory_room(), private_bytes(main.pid) if main.pid else None
    if not second_server_fits(room, need):
        log.warning(
            "no second llama-server: the memory left would not hold it; chat uses the main "
            "one through the gate",
            extra={
                "event": "llama_server_split_skipped",
                "memory_left_bytes": room,
                "first_server_private_bytes": need,
            },
        )
        app[STARTUP].second_not_started = "the memory left would not hold it"
        return
    await _start_llama(app, rest[0], second=True)


async def llama_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    plan = app[THREAD_PLAN]
    app[LLAMA] = None
    app[LLAMA_SECOND] = None
    servers: list[LlamaServer] = []
    tasks: list[asyncio.Task[None]] = []
    if settings.chat:
        binary = native.llama_server_path(settings.llama_server_binary)
        if binary is None:
            raise LlamaServerError("no llama-server binary (bundled, $SEMIF_LLAMA_SERVER or PATH)")
        supervision = Supervision(
            start_timeout=settings.llama_server_start_timeout,
            probe_interval=settings.health_interval,
            probe_timeout=settings.health_timeout,
            max_failed_probes=settings.max_failed_probes,
        )
        # Its arguments are set once the weights' layout is decided (_start_all).
        server = LlamaServer(binary, settings.model_path, settings.upstream_port, [], supervision)
        app[LLAMA] = server  # "waiting"/"starting": /ping says 503 until it is healthy
        servers.append(server)
        policy = app[CPU_POLICY]
        if plan.why:
            log.info(
                f"CPU sharing dynamic planned as the gate: {plan.why}",
                extra={"event": "cpu_dynamic_fallback", "why": plan.why},
            )
        policy.attach(server=server)
        if policy.second_server:
            # The same model file: the weights are mmap'ed once; each has its own KV cache.
            assert settings.second_upstream_port is not None  # planned only with a port
            split = LlamaServer(
                binary, settings.model_path, settings.second_upstream_port, [], supervision
            )
            app[LLAMA_SECOND] = split
            servers.append(split)
            policy.attach(split=split)
        tasks = [asyncio.create_task(_start_all(app, servers))]
    yield
    for task in tasks:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for server in servers:
        await server.stop()


async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    # A fresh loopback connection per call: llama-server may close a kept-alive connection
    # after a streamed answer, and the next call on it then failed with ServerDisconnectedError
    # (a 503 for a healthy server; seen once in 30 stream-then-chat pairs). A loopback connect
    # costs microseconds against a model call.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        app[UPSTREAM] = session
        yield

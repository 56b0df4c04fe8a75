from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from semif_proxy.engine import native
from semif_proxy.testing.server import PRESETS, ProxyProcess, free_port
from tests.helpers.app_server import AppServer
from tests.helpers.tiny_model import write_tiny_model

DEFAULT_MODEL = (
    Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-proxy"))
    / "models"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
GPU_LAYERS = int(os.environ.get("SEMIF_TEST_GPU_LAYERS", "0"))


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs a CLI command in-process configures logging (a handler on that test's
    captured stderr); the next test must not inherit it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = Path(os.environ.get("SEMIF_TEST_MODEL", DEFAULT_MODEL))
    if not path.is_file():
        pytest.fail(f"default model missing at {path}; run `make model`")
    return path


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    path = os.environ.get("SEMIF_TEST_QWEN")
    if not path or not Path(path).is_file():
        pytest.skip("Qwen2.5 model not fetched (make model-qwen; SEMIF_TEST_QWEN)")
    return Path(path)


@pytest.fixture(scope="session")
def qwen15_path() -> Path:
    path = os.environ.get("SEMIF_TEST_QWEN15")
    if not path or not Path(path).is_file():
        pytest.skip("Qwen2.5-1.5B model not fetched (make model-qwen15; SEMIF_TEST_QWEN15)")
    return Path(path)


@pytest.fixture(scope="session", autouse=True)
def layout_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SEMIF_REPACK=auto keeps its measurements under XDG_CACHE_HOME (engine/layout_cache.py):
    the run's own folder, never the user's home, so every run measures what it runs. Both xdist
    workers share it (their base folders have one parent; the first to finish a measurement
    keeps it), and pytest removes it with its old base folders."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "layout-cache"
    folder.mkdir(exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_merging_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "merge.gguf", letter_merges=True)


@pytest.fixture(scope="session")
def engine(model_path: Path) -> native.Engine:
    return native.Engine(str(model_path), n_ctx=4096, n_threads=2, n_gpu_layers=GPU_LAYERS, n_seq=8)


@contextlib.contextmanager
def running_llama_server(
    model: Path, ctx_size: int = 2048, repack: bool | None = None
) -> Iterator[str]:
    """A real llama-server (loopback, free port) set up like our engine: flash attention off
    and the engine's weight layout (`repack`; None: the one SEMIF_REPACK=auto chooses for an
    engine of engine_settings() on this machine: a repacked Q4_K model computes slightly
    different numbers), so its next-token distribution can be compared with ours."""
    import asyncio

    from semif_proxy.cpu.plan import memory_room
    from semif_proxy.engine.layout import resolve
    from semif_proxy.llama_server.supervisor import LlamaServer

    if repack is None:
        # As DecisionEngine.load chooses it for an engine of these settings.
        chosen = asyncio.run(resolve(engine_settings(model), 2, 3, memory_room(), chat=True))
        repack = chosen.choice.on
    layout = [] if repack else ["--no-repack"]

    binary = native.llama_server_path()
    assert binary is not None
    loop = asyncio.new_event_loop()
    server = LlamaServer(
        binary,
        model,
        free_port(),
        [
            "--ctx-size",
            str(ctx_size),
            "--threads",
            "1",
            "--parallel",
            "1",
            "--flash-attn",
            "off",
            "--n-gpu-layers",
            str(GPU_LAYERS),
            *layout,
        ],
    )
    loop.run_until_complete(server.start())
    try:
        yield server.base_url
    finally:
        loop.run_until_complete(server.stop())
        loop.close()


@pytest.fixture(scope="session")
def llama_server_url(model_path: Path) -> Iterator[str]:
    """A real llama-server on the default model, for parity checks."""
    with running_llama_server(model_path) as url:
        yield url


StartProxy = Callable[..., ProxyProcess]


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[StartProxy]:
    """Real servers for one test, each logging to the test's own folder; whatever happens in
    the test, every one is stopped at its end (the one teardown of the suite's servers).

    start_proxy(model, env=None, preset="full", launch=False, timeout=120): `preset` names
    semif_proxy.testing.server.PRESETS, `env` goes on top of it; launch=True returns the
    process started but not yet ready (for tests of the start itself)."""
    started: list[ProxyProcess] = []

    def start(
        model: Path | None,
        env: dict[str, str | None] | None = None,
        *,
        preset: str = "full",
        launch: bool = False,
        timeout: float = 120.0,
    ) -> ProxyProcess:
        log = tmp_path / f"proxy-{len(started)}.log"
        server = ProxyProcess(model, {**PRESETS[preset], **(env or {})}, log_path=log)
        started.append(server)
        return server.launch() if launch else server.start(timeout)

    yield start
    for server in reversed(started):
        server.stop()


StartApp = Callable[..., AppServer]


@pytest.fixture
def start_app(tmp_path: Path) -> Iterator[StartApp]:
    """The app in this process (tests/helpers/app_server.py: create_app with the real engine
    and model, and the real llama-server with chat on), served on a loopback port with
    ProxyProcess's interface, for the tests of what the server answers; whatever happens in the
    test, each one is stopped at its end. Seconds faster than a process to start, and as ready:
    it returns once /ping would say 200, woken by the loads themselves.

    start_app(model, env=None, preset="decisions", launch=False, timeout=120, log=False):
    `preset` names semif_proxy.testing.server.PRESETS (chat off unless the test asks), `env`
    goes on top of it, launch=True returns it with the port open and the loads still running,
    log=True writes its JSON log lines to the test's folder (log_lines()). A module's shared
    server is an AppServer(...).start() in a module-scoped fixture, stopped at its end."""
    started: list[AppServer] = []

    def start(
        model: Path | None,
        env: dict[str, str | None] | None = None,
        *,
        preset: str = "decisions",
        launch: bool = False,
        timeout: float = 120.0,
        log: bool = False,
    ) -> AppServer:
        log_path = tmp_path / f"app-{len(started)}.log" if log else None
        server = AppServer(model, env, preset=preset, log_path=log_path)
        started.append(server)
        return server.launch() if launch else server.start(timeout)

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture(scope="session")
def proxy(model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real semif-proxy (with its real llama-server) for the whole session."""
    log_path = tmp_path_factory.mktemp("logs") / "proxy.log"
    server = ProxyProcess(model_path, {"SEMIF_MAX_DECISIONS": "24"}, log_path=log_path).start()
    server.log_path = log_path
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_boundary_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "boundary.gguf", boundary_merge=True)


def engine_settings(model: Path, **overrides: object):
    from semif_proxy.settings import load_settings

    base = {"n_ctx": 4096, "n_threads": 2, "n_gpu_layers": GPU_LAYERS, "chat": False}
    base.update(overrides)
    return load_settings({}, model=str(model), **base)


@pytest.fixture(scope="session")
def decision_engine(model_path: Path):
    from semif_proxy.engine.worker import DecisionEngine

    engine = DecisionEngine.load(engine_settings(model_path))
    yield engine
    engine.close()


# The longest files (over half a minute each on 2 cores), handed out first: `make test` gives
# the two workers whole files in collection order, and a long file handed out last leaves one
# worker idle while the other finishes it.
LONG_FIRST = (
    "test_robustness.py",
    "test_packaging.py",
    "test_native.py",
    "test_engine.py",
    "test_sagemaker.py",
    "test_eval_resume.py",
    "test_playground.py",
    "test_one_answer.py",
    "test_systemone_batch.py",
    "test_systemone.py",
    "test_server.py",
    "test_batch_transform.py",
    "test_decide_cli.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first (LONG_FIRST), each file's tests kept in their order; then the GPU
    check's adjustments (tests/helpers/gpu_run.py): SmolLM2-only tests skipped on a generated
    model, CPU-speed premises xfail with offload. Nothing without their variables."""
    from tests.helpers import gpu_run

    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable
    gpu_run.adjust(items)

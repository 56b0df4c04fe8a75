"""The compiled engine and the files shipped beside it (libllama, llama-server)."""

from __future__ import annotations

import shutil
from pathlib import Path

from semif_proxy import _engine
from semif_proxy._engine import (
    ERR_ABORTED,
    ERR_BAD_ARGUMENT,
    ERR_CONTEXT_OVERFLOW,
    ERR_LOAD_FAILED,
    ERR_STATE_FAILED,
    Engine,
    LlamaError,
)

__all__ = [
    "ERR_ABORTED",
    "ERR_BAD_ARGUMENT",
    "ERR_CONTEXT_OVERFLOW",
    "ERR_LOAD_FAILED",
    "ERR_STATE_FAILED",
    "Engine",
    "LlamaError",
    "build_info",
    "devices",
    "gpu_devices",
    "llama_server_path",
    "load_backends",
]


def bundled_dir() -> Path:
    """Directory the wheel puts libllama and llama-server in (next to the extension)."""
    return Path(_engine.__file__).resolve().parent / "llama"


def llama_server_path(override: Path | None = None) -> Path | None:
    """The llama-server to run: the one configured (SEMIF_LLAMA_SERVER), the bundled one, or one
    on PATH (the AWS image keeps it in /opt/llama.cpp/bin)."""
    if override:
        return Path(override)
    bundled = bundled_dir() / "llama-server"
    if bundled.is_file():
        return bundled
    found = shutil.which("llama-server")
    return Path(found) if found else None


def load_backends(folder: Path) -> None:
    """Load ggml's loadable backends from a folder (GGML_BACKEND_DL builds). Without it the
    extension loads them from its libllama's folder at import, if none were linked in."""
    _engine.load_backends(str(folder))


def devices() -> list[dict[str, object]]:
    return list(_engine.devices())


def gpu_devices() -> list[dict[str, object]]:
    return [d for d in devices() if d["type"] in ("gpu", "igpu")]


def build_info() -> dict[str, object]:
    return {
        "llama_cpp_build": int(_engine.LLAMA_BUILD_NUMBER),
        "llama_cpp_commit": str(_engine.LLAMA_BUILD_COMMIT),
        "gpu_offload": bool(_engine.supports_gpu_offload()),
        "backend_dir": str(_engine.BACKEND_DIR) or None,
        "devices": [f"{d['type']}:{d['name']}" for d in devices()],
        "system_info": _engine.system_info(),
    }

"""The compiled engine and the files shipped beside it (libllama, llama-server)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from semif_proxy import _engine
from semif_proxy._engine import (
    ERR_BAD_ARGUMENT,
    ERR_CONTEXT_OVERFLOW,
    ERR_LOAD_FAILED,
    ERR_STATE_FAILED,
    Engine,
    LlamaError,
)

__all__ = [
    "ERR_BAD_ARGUMENT",
    "ERR_CONTEXT_OVERFLOW",
    "ERR_LOAD_FAILED",
    "ERR_STATE_FAILED",
    "Engine",
    "LlamaError",
    "build_info",
    "llama_server_path",
]

LLAMA_SERVER_ENV = "SEMIF_LLAMA_SERVER"


def bundled_dir() -> Path:
    """Directory the wheel puts libllama and llama-server in (next to the extension)."""
    return Path(_engine.__file__).resolve().parent / "llama"


def llama_server_path() -> Path | None:
    """The llama-server to run: $SEMIF_LLAMA_SERVER, the bundled one, or one on PATH."""
    override = os.environ.get(LLAMA_SERVER_ENV)
    if override:
        return Path(override)
    bundled = bundled_dir() / "llama-server"
    if bundled.is_file():
        return bundled
    found = shutil.which("llama-server")
    return Path(found) if found else None


def build_info() -> dict[str, object]:
    return {
        "llama_cpp_build": int(_engine.LLAMA_BUILD_NUMBER),
        "llama_cpp_commit": str(_engine.LLAMA_BUILD_COMMIT),
        "gpu_offload": bool(_engine.supports_gpu_offload()),
        "system_info": _engine.system_info(),
    }

"""What the container checks about itself: the extension loads, its libllama is the one expected
(the image's own, not a bundled copy), ggml's backends are registered, a model really loads and
computes, and llama-server is there and of the same llama.cpp build as the engine."""

from __future__ import annotations

import math
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from semif_proxy.engine import native
from semif_proxy.llama_server.version import parse_version
from semif_proxy.model.tiny_gguf import write_tiny_llama


class SelfCheckError(RuntimeError):
    pass


def server_version(binary: Path) -> tuple[int, str]:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SelfCheckError(f"{binary} --version did not run: {exc}") from None
    try:
        return parse_version(out.stdout + out.stderr)
    except ValueError as exc:
        raise SelfCheckError(f"{binary}: {exc}") from None


def loaded_libraries(name: str = "libllama") -> list[str]:
    """Paths of the shared objects mapped into this process whose file name starts with name."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5]).name.startswith(name + "."):
            found.append(parts[5])
    return sorted(set(found))


def compute_check() -> dict[str, Any]:
    """Load a tiny generated model and score one prompt: proves that the backends this process
    registered can load weights and run a forward pass (a GGML_BACKEND_DL build whose backends
    were never loaded fails exactly here, not at import)."""
    if not any(d["type"] == "cpu" for d in native.devices()):
        raise SelfCheckError(
            "no CPU backend is registered: ggml's loadable backends (libggml-cpu*.so) were not "
            "found next to libllama; set SEMIF_GGML_BACKEND_DIR to their folder"
        )
    with tempfile.TemporaryDirectory(prefix="semif-selfcheck-") as tmp:
        model = write_tiny_llama(Path(tmp) / "tiny.gguf", n_ctx=256)
        try:
            engine = native.Engine(str(model), n_ctx=256, n_threads=1, n_seq=3)
            tokens = list(engine.tokenize("selfcheck: abc", add_special=True))
            logits, _, _ = engine.score(tokens, [[]], [0, 1, 2], "restore")
        except native.LlamaError as exc:
            raise SelfCheckError(f"the engine cannot run a model: {exc}") from None
    values = [float(v) for v in logits.ravel()]
    if not values or not all(math.isfinite(v) for v in values):
        raise SelfCheckError(f"the engine computed non-finite logits: {values}")
    return {"forward_pass": "ok", "logits": [round(v, 4) for v in values]}


def run(require_system_libllama: bool = False, llama_server: Path | None = None) -> dict[str, Any]:
    info = native.build_info()
    libs = loaded_libraries()
    if not libs:
        raise SelfCheckError("the engine extension loaded but no libllama is mapped")
    bundled = str(native.bundled_dir())
    if require_system_libllama and any(lib.startswith(bundled) for lib in libs):
        raise SelfCheckError(f"libllama comes from the wheel ({libs}), not from the image")
    report: dict[str, Any] = {
        "llama_cpp_build": info["llama_cpp_build"],
        "llama_cpp_commit": info["llama_cpp_commit"],
        "libllama": libs,
        "backend_dir": info["backend_dir"],
        "devices": info["devices"],
        "gpu_offload": info["gpu_offload"],
        "system_info": info["system_info"],
    }
    report.update(compute_check())
    server = native.llama_server_path(llama_server)
    if server is None or not server.is_file():
        raise SelfCheckError("no llama-server: not bundled, not $SEMIF_LLAMA_SERVER, not on PATH")
    build, commit = server_version(server)
    report.update(
        {"llama_server": str(server), "llama_server_build": build, "llama_server_commit": commit}
    )
    if build != info["llama_cpp_build"]:
        raise SelfCheckError(
            f"llama-server is build {build} ({commit}) but the engine was built against the "
            f"headers of build {info['llama_cpp_build']} ({info['llama_cpp_commit']})"
        )
    return report

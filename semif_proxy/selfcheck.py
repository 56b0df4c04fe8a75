"""What the container checks about itself: the extension loads, llama-server is there, and the
libllama the extension uses is the one expected (the image's own, not a bundled copy)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from semif_proxy import native


class SelfCheckError(RuntimeError):
    pass


def loaded_libraries(name: str = "libllama") -> list[str]:
    """Paths of the shared objects mapped into this process whose file name starts with name."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5]).name.startswith(name + "."):
            found.append(parts[5])
    return sorted(set(found))


def server_build(binary: Path) -> int | None:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    match = re.search(r"build (\d+)", out.stdout + out.stderr)
    return int(match.group(1)) if match else None


def run(require_system_libllama: bool = False) -> dict[str, Any]:
    info = native.build_info()
    libs = loaded_libraries()
    if not libs:
        raise SelfCheckError("the engine extension loaded but no libllama is mapped")
    bundled = str(native.bundled_dir())
    if require_system_libllama and any(lib.startswith(bundled) for lib in libs):
        raise SelfCheckError(f"libllama comes from the wheel ({libs}), not from the image")
    server = native.llama_server_path()
    if server is None or not server.is_file():
        raise SelfCheckError("no llama-server: not bundled, not $SEMIF_LLAMA_SERVER, not on PATH")
    build = server_build(server)
    report = {
        "llama_cpp_build": info["llama_cpp_build"],
        "libllama": libs,
        "llama_server": str(server),
        "llama_server_build": build,
        "gpu_offload": info["gpu_offload"],
        "system_info": info["system_info"],
    }
    if build is not None and build != info["llama_cpp_build"]:
        raise SelfCheckError(
            f"llama-server is build {build} but the engine was built for "
            f"{info['llama_cpp_build']}: {report}"
        )
    return report

"""The wheel, built for real in both CMake modes, and what it carries.

Mode (a) builds against the pinned llama.cpp tree (its cached build is reused, so only the
extension compiles); mode (b) links an *installed* libllama, laid out like the DLC image's
(lib/, include/, bin/), made here from the same cached build. Each wheel is unpacked and its
extension imported from the unpacked tree in a fresh interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-proxy"))
LLAMA = CACHE / "llama.cpp-b11312"
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (LLAMA / "build-cpu" / "bin" / "libllama.so").is_file(),
        reason="needs the cached llama.cpp build (make build)",
    ),
]


def build_wheel(out: Path, build_dir: Path, defines: dict[str, str]) -> Path:
    args = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        str(ROOT),
        "--no-build-isolation",
        "--no-deps",
        "-q",
        "-w",
        str(out),
        f"-Cbuild-dir={build_dir}",
    ]
    args += [f"-Ccmake.define.{k}={v}" for k, v in defines.items()]
    subprocess.run(args, check=True, cwd=ROOT, timeout=900)
    [wheel] = out.glob("semif_proxy-*.whl")
    return wheel


def rpath(binary: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True)
    lines = [li for li in out.stdout.splitlines() if "RPATH" in li or "RUNPATH" in li]
    return lines[0].split("[", 1)[1].rstrip("]") if lines else ""


def import_from(tree: Path, env: dict[str, str] | None = None) -> str:
    """Import the unpacked extension in a fresh interpreter that cannot see the editable one."""
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
        "type(f).__module__.lower() and 'skbuild' not in type(f).__module__.lower()]; "
        f"sys.path.insert(0, {str(tree)!r}); import semif_proxy._engine as e; "
        "print(e.__file__); print(e.LLAMA_BUILD_NUMBER); print(e.system_info())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_wheel_mode_a_carries_engine_libs_and_server(tmp_path: Path) -> None:
    wheel = build_wheel(
        tmp_path,
        CACHE / "build" / "wheel-test-a",
        {
            "SEMIF_LLAMA_SOURCE_DIR": str(LLAMA / "src"),
            "SEMIF_LLAMA_BUILD_DIR": str(LLAMA / "build-cpu"),
        },
    )
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("semif_proxy/_engine.") and n.endswith(".so") for n in names)
    for lib in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so", "llama-server"):
        assert f"semif_proxy/llama/{lib}" in names, lib
    assert "semif_proxy/http/app.py" in names and not any(".cpp" in n for n in names)
    for asset in ("index.html", "app.js", "examples.js", "style.css"):
        assert f"semif_proxy/http/playground/{asset}" in names, asset
    tree = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(tree)
    engine = next((tree / "semif_proxy").glob("_engine.*.so"))
    server = tree / "semif_proxy" / "llama" / "llama-server"
    assert rpath(engine) == "$ORIGIN/llama"
    assert rpath(server) == "$ORIGIN"
    server.chmod(0o755)  # zipfile does not restore modes; pip does
    version = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    assert "build 11312" in version.stdout + version.stderr
    out = import_from(tree, {"LD_LIBRARY_PATH": ""})
    assert str(tree) in out and "11312" in out


def installed_prefix() -> Path:
    """An installed llama.cpp as a distribution image holds it: lib/, include/, bin/."""
    prefix = CACHE / "installed-b11312"
    if (prefix / "lib" / "libllama.so").is_file():
        return prefix
    bin_dir = LLAMA / "build-cpu" / "bin"
    shutil.rmtree(prefix, ignore_errors=True)
    for sub in ("lib", "include", "bin"):
        (prefix / sub).mkdir(parents=True)
    for lib in bin_dir.glob("lib*.so"):
        shutil.copy2(lib, prefix / "lib")
    for header_dir in (LLAMA / "src" / "include", LLAMA / "src" / "ggml" / "include"):
        for header in header_dir.glob("*.h"):
            shutil.copy2(header, prefix / "include")
    shutil.copy2(bin_dir / "llama-server", prefix / "bin")
    return prefix


def test_wheel_mode_b_links_an_installed_libllama(tmp_path: Path) -> None:
    prefix = installed_prefix()
    wheel = build_wheel(
        tmp_path,
        CACHE / "build" / "wheel-test-b",
        {
            "SEMIF_LLAMA_LIB_DIR": str(prefix / "lib"),
            "SEMIF_LLAMA_INCLUDE_DIR": str(prefix / "include"),
            "SEMIF_LLAMA_SERVER_PATH": str(prefix / "bin" / "llama-server"),
        },
    )
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("semif_proxy/_engine.") for n in names)
    assert "semif_proxy/llama/llama-server" in names
    # The image's own libllama is used: none is copied into the wheel.
    assert not any(n.startswith("semif_proxy/llama/lib") for n in names)
    tree = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(tree)
    engine = next((tree / "semif_proxy").glob("_engine.*.so"))
    needed = subprocess.run(["readelf", "-d", str(engine)], capture_output=True, text=True).stdout
    assert "libllama.so" in needed
    # Found through the loader path, as in the image (ldconfig there, LD_LIBRARY_PATH here).
    out = import_from(tree, {"LD_LIBRARY_PATH": str(prefix / "lib")})
    assert str(tree) in out and "11312" in out

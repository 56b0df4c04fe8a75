"""Make the CUDA toolkit found by nvcc complete enough to build llama.cpp's GGML_CUDA backend.

ggml-cuda (b11312) always links cuBLAS (CUDA::cublas) and, with its VMM pool, the driver
library (CUDA::cuda_driver); llama.cpp has no option to build it without them. A toolkit
assembled from NVIDIA's pip wheels (nvcc, cudart, CCCL: what this project's machines have) has
neither. This script fills the gaps in one folder and writes the CMake definitions that point
llama.cpp's FindCUDAToolkit at it, one `-DNAME=VALUE` a line, to stdout and to
OUT/cmake-args.txt (the file cmake/llama_cpp.cmake's SEMIF_CUDA_LINK_FILE names; only the
compiler's path when the toolkit is complete):

- cuBLAS headers and libraries: taken from an installed `nvidia-cublas` wheel (the GPU host's
  PyTorch environment has one), else from the pinned wheel downloaded with
  `pip download --no-deps` (never installed) into the cache.
- libcuda.so: the driver's, if one is on the machine; else a link-time stub generated from the
  toolkit's own cuda.h (every `cu*` entry point returns CUDA_ERROR_STUB_LIBRARY). Its soname is
  libcuda.so.1, so at run time the real driver is loaded, never the stub.

    python scripts/cuda_link_deps.py [--out DIR] [--offline]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

CUBLAS_WHEEL = "nvidia-cublas==13.0.2.14"  # cuBLAS of CUDA 13.0 (update 2), matches nvcc 13.0
CUDA_ERROR_STUB_LIBRARY = 34
DRIVER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
)


def cache_root() -> Path:
    base = os.environ.get("SEMIF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "semif-proxy"
    )
    return Path(base)


def fail(message: str) -> None:
    sys.stderr.write(f"cuda_link_deps: {message}\n")
    raise SystemExit(2)


def toolkit_root() -> Path:
    """The toolkit nvcc belongs to (a wrapper script named nvcc on PATH is looked through)."""
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    candidates += [
        os.path.join(os.environ[v], "bin/nvcc")
        for v in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(v)
    ]
    candidates += ["/usr/local/cuda/bin/nvcc", *sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"))]
    for nvcc in filter(None, candidates):
        root = Path(nvcc).resolve().parent.parent
        if (root / "include/cuda.h").is_file() and (root / "bin/nvcc").is_file():
            return root
    fail("no CUDA toolkit found (put its bin/nvcc on PATH or set CUDACXX)")
    raise AssertionError


def _lib_dirs(root: Path) -> list[Path]:
    return [root / "lib64", root / "lib", root / "targets/x86_64-linux/lib"]


def toolkit_has_cublas(root: Path) -> bool:
    headers = (root / "include/cublas_v2.h").is_file() or (
        root / "targets/x86_64-linux/include/cublas_v2.h"
    ).is_file()
    return headers and any((d / "libcublas.so").exists() for d in _lib_dirs(root))


def find_driver(root: Path) -> Path | None:
    """An unversioned libcuda.so that the linker can use (the driver's or the toolkit's stub)."""
    dirs = [d / "stubs" for d in _lib_dirs(root)] + _lib_dirs(root) + [Path(d) for d in DRIVER_DIRS]
    for d in dirs:
        if (d / "libcuda.so").exists():
            return d / "libcuda.so"
    return None


def installed_cublas() -> Path | None:
    """nvidia/cu13 of an installed nvidia-cublas wheel (headers + libcublas*.so.13), if any."""
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for python in ("python3",):  # the GPU host's python3 (PyTorch's environment) may differ
        exe = shutil.which(python)
        if exe and Path(exe).resolve() != Path(sys.executable).resolve():
            out = subprocess.run(
                [exe, "-c", "import sys; print('\\n'.join(sys.path))"],
                capture_output=True,
                text=True,
            )
            roots.update(out.stdout.split())
    for base in sorted(r for r in roots if r):
        cu13 = Path(base) / "nvidia/cu13"
        if (cu13 / "include/cublas_v2.h").is_file() and (cu13 / "lib/libcublas.so.13").exists():
            return cu13
    return None


def downloaded_cublas(out: Path, offline: bool) -> Path:
    """Extract the pinned cuBLAS wheel's include/ and lib/ into out/cublas (download once)."""
    target = out / "cublas"
    if (target / "lib/libcublas.so.13").exists() and (target / "include/cublas_v2.h").exists():
        return target
    downloads = cache_root() / "downloads"
    version = CUBLAS_WHEEL.split("==")[1]
    wheels = sorted(downloads.glob(f"nvidia_cublas-{version}-*.whl"))
    if not wheels:
        if offline:
            fail(f"no cuBLAS in the toolkit, no installed nvidia-cublas, --offline: {CUBLAS_WHEEL}")
        downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", CUBLAS_WHEEL]
        cmd += ["--only-binary=:all:", "-d", str(downloads)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(downloads.glob(f"nvidia_cublas-{version}-*.whl"))
        if result.returncode != 0 or not wheels:
            fail(f"pip download {CUBLAS_WHEEL} failed (exit {result.returncode}): {result.stderr}")
    tmp = out / "cublas.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for member in wheel.namelist():
            if member.startswith("nvidia/cu13/") and not member.endswith("/"):
                wheel.extract(member, tmp)
    shutil.rmtree(target, ignore_errors=True)
    (tmp / "nvidia/cu13").rename(target)
    shutil.rmtree(tmp)
    return target


def link_dir(cu13: Path, out: Path) -> Path:
    """out/lib with libcublas.so / libcublasLt.so links (what find_library wants) and the
    .so.13 names (what executables linked against libggml-cuda look for)."""
    lib = out / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("libcublas", "libcublasLt"):
        for link in (lib / f"{name}.so", lib / f"{name}.so.13"):  # the .so.13: see driver_stub
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(cu13 / "lib" / f"{name}.so.13")
    return lib


def driver_stub(root: Path, out: Path) -> Path:
    """A link-time libcuda.so (soname libcuda.so.1) exporting every entry point of cuda.h."""
    lib = out / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    stub = lib / "libcuda.so"
    # The name executables linked against libggml-cuda look for (its DT_NEEDED): the linker
    # finds it here through CMake's -rpath-link. Never put this folder on a run-time path.
    soname = lib / "libcuda.so.1"
    if not soname.is_symlink():
        soname.symlink_to("libcuda.so")
    if stub.exists():
        return stub
    include = root / "include"
    cc = shutil.which("cc") or shutil.which("gcc") or fail("no C compiler for the libcuda stub")
    pre = subprocess.run(
        [cc, "-E", "-P", f"-I{include}", str(include / "cuda.h")], capture_output=True, text=True
    )
    if pre.returncode != 0:
        fail(f"could not preprocess cuda.h: {pre.stderr[-1000:]}")
    # After preprocessing, cuda.h's version macros (cuMemAlloc -> cuMemAlloc_v2 ...) are applied,
    # so these are exactly the symbols that code compiled against this cuda.h references.
    names = sorted(set(re.findall(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(", pre.stdout)))
    if len(names) < 100:
        fail(f"found only {len(names)} driver entry points in {include / 'cuda.h'}")
    source = out / "libcuda_stub.c"
    source.write_text(
        "/* Link-time stub of the CUDA driver API, generated by scripts/cuda_link_deps.py. */\n"
        + "".join(f"int {n}(void) {{ return {CUDA_ERROR_STUB_LIBRARY}; }}\n" for n in names)
    )
    cmd = [cc, "-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)]
    if subprocess.run(cmd).returncode != 0:
        fail("could not compile the libcuda stub")
    return stub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=cache_root() / "cuda-link")
    parser.add_argument("--offline", action="store_true", help="never call pip download")
    args = parser.parse_args(argv)
    root = toolkit_root()
    out = args.out.resolve()
    defines: list[str] = []
    if not toolkit_has_cublas(root):
        cu13 = installed_cublas() or downloaded_cublas(out, args.offline)
        lib = link_dir(cu13, out)
        defines += [
            f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so'}",
            f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so'}",
            f"-DCMAKE_CUDA_FLAGS=-I{cu13 / 'include'}",
        ]
        sys.stderr.write(f"cuda_link_deps: cuBLAS from {cu13}\n")
    driver = find_driver(root)
    if driver is None:
        driver = driver_stub(root, out)
        sys.stderr.write(f"cuda_link_deps: no libcuda.so here, linking against stub {driver}\n")
    defines.append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    if (out / "lib").is_dir():
        # Executables (llama-server) linked against libggml-cuda must find what it needs by
        # its sonames (libcuda.so.1, libcublas.so.13): at link time only, never at run time.
        defines.append(f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{out / 'lib'}")
    defines.insert(0, f"-DCMAKE_CUDA_COMPILER={root / 'bin/nvcc'}")
    text = "\n".join(defines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cmake-args.txt").write_text(text)  # what SEMIF_CUDA_LINK_FILE names
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Download the pinned llama.cpp source (from the llama-cpp-python sdist) into a cache.

Prints the path of the extracted ``llama.cpp`` tree on stdout. Idempotent: a tree that was
extracted before (marked by a stamp file) is reused without touching the network.

What it does goes to stderr: a line before each step, and on a terminal pip's own download bar
(bytes, speed, ETA); elsewhere (a CI log) pip's output is kept back and a line says how many
bytes came in how long.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_BUILD = "b11312"
VENDOR_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"


def cache_root() -> Path:
    base = os.environ.get("SEMIF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "semif-proxy"
    )
    return Path(base)


# The checkouts' own copy of a file hash and of the cache root (scripts/fetch_model.py imports
# both from here). The package has them too (semif_proxy.model.files.file_sha256), but these
# scripts run with the system's python3 before the venv and the package exist (the Makefile
# fetches the llama.cpp source to build the package), so they stay standalone.
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fail(message: str) -> None:
    sys.stderr.write(f"fetch_llama_cpp: {message}\n")
    raise SystemExit(2)


def note(script: str, message: str) -> None:
    sys.stderr.write(f"{script}: {message}\n")
    sys.stderr.flush()


def megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def run_pip(args: list[str]) -> tuple[int, str]:
    """`python -m pip <args>`: its exit status and, for an error message, the end of what it
    said. On a terminal pip writes to our stderr, so its own progress bar shows (stdout stays
    for the path these scripts print); elsewhere its output is captured."""
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    if sys.stderr.isatty():
        result = subprocess.run([*cmd, "--progress-bar", "on"], stdout=sys.stderr)
        return result.returncode, "(pip's output is above)"
    captured = subprocess.run(cmd, capture_output=True, text=True)
    return captured.returncode, captured.stderr[-2000:]


def download_sdist(dest: Path) -> Path:
    archive = dest / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if archive.exists() and sha256_of(archive) == SDIST_SHA256:
        return archive
    dest.mkdir(parents=True, exist_ok=True)
    args = [
        "download",
        "--no-deps",
        "--no-binary",
        SDIST_PACKAGE,
        f"{SDIST_PACKAGE}=={SDIST_VERSION}",
        "-d",
        str(dest),
    ]
    note(
        "fetch_llama_cpp",
        f"downloading llama.cpp {LLAMA_CPP_BUILD} (in {SDIST_PACKAGE} {SDIST_VERSION}'s sdist, "
        f"~77 MB) into {dest}",
    )
    start = time.monotonic()
    # pip prepares the sdist's metadata, which needs its build backend: --no-build-isolation
    # uses the one installed here, where there is one, instead of installing it for pip. Some
    # pip versions insist on their own: retry with isolation before giving up.
    tries = [["--no-build-isolation"], []]
    if importlib.util.find_spec("scikit_build_core") is None:
        tries = [[]]
    for extra in tries:
        code, said = run_pip([*args, *extra])
        if code == 0 and archive.exists():
            break
    if code != 0 or not archive.exists():
        fail(f"could not download {SDIST_PACKAGE}=={SDIST_VERSION} with pip (exit {code}):\n{said}")
    seconds = time.monotonic() - start
    size = megabytes(archive.stat().st_size)
    note("fetch_llama_cpp", f"{archive.name}: {size} in {seconds:.0f} s")
    actual = sha256_of(archive)
    if actual != SDIST_SHA256:
        archive.unlink()
        fail(f"sha256 mismatch for {archive.name}: expected {SDIST_SHA256}, got {actual}")
    return archive


def extract_vendor_tree(archive: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".extract-"))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(VENDOR_PREFIX)]
            if not members:
                fail(f"{archive.name} has no {VENDOR_PREFIX} tree")
            tar.extractall(tmp, members=members, filter="data")
        if target.exists():
            shutil.rmtree(target)
        (tmp / VENDOR_PREFIX).rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, default=cache_root())
    args = parser.parse_args()
    root: Path = args.cache / f"llama.cpp-{LLAMA_CPP_BUILD}"
    source = root / "src"
    stamp = root / "src.sha256"
    if not (stamp.exists() and stamp.read_text().strip() == SDIST_SHA256 and source.is_dir()):
        root.mkdir(parents=True, exist_ok=True)
        archive = download_sdist(args.cache / "downloads")
        note("fetch_llama_cpp", f"extracting llama.cpp {LLAMA_CPP_BUILD} into {source}")
        extract_vendor_tree(archive, source)
        stamp.write_text(SDIST_SHA256 + "\n")
    print(source)


if __name__ == "__main__":
    main()

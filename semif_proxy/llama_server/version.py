"""The llama.cpp build a `llama-server --version` output names. Pure: the container's builder
stage runs it (`python3 -m semif_proxy.llama_server.version < version.txt`) before anything
is built."""

from __future__ import annotations

import re
import sys

# What `llama-server --version` has printed over llama.cpp's history, newest first.
_FORMATS = (
    # "version: 0.0.11312 (build 11312, commit 0c1e570)"
    re.compile(r"\(build (?P<build>\d+), commit (?P<commit>[0-9A-Za-z]+)\)"),
    # "version: 4589 (6d2a6f3b)"
    re.compile(r"^version: (?P<build>\d+) \((?P<commit>[0-9A-Za-z]+)\)", re.MULTILINE),
    # "build: 1234 (abcdef12) with cc ..." / "build = 1234 (abcdef12)"
    re.compile(r"\bbuild ?[:=] ?(?P<build>\d+) \((?P<commit>[0-9A-Za-z]+)\)"),
)


def parse_version(text: str) -> tuple[int, str]:
    """(build number, commit) from `llama-server --version` output, or ValueError."""
    for pattern in _FORMATS:
        match = pattern.search(text)
        if match:
            return int(match.group("build")), match.group("commit")
    first = text.strip().splitlines()[0] if text.strip() else "(nothing)"
    raise ValueError(f"unrecognised llama-server --version output: {first!r}")


def main() -> int:
    """stdin: the output of `llama-server --version`; stdout: `BUILD COMMIT`; exit 1 if unknown."""
    try:
        build, commit = parse_version(sys.stdin.read())
    except ValueError as exc:
        sys.stderr.write(f"llama_version: {exc}\n")
        return 1
    sys.stdout.write(f"{build} {commit}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a shared object exports, read with readelf (binutils), for the tests that check it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def exported_symbols(path: Path | str) -> set[str]:
    """Names of the functions and data a shared object defines and exports (GLOBAL or WEAK,
    not undefined): what the dynamic linker may bind another library's references to."""
    shown = subprocess.run(
        ["readelf", "--dyn-syms", "--wide", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return {
        fields[7]
        for line in shown.splitlines()
        if len(fields := line.split()) >= 8
        and fields[4] in ("GLOBAL", "WEAK")
        and fields[6] != "UND"
        and fields[3] in ("FUNC", "OBJECT", "TLS", "IFUNC")
    }

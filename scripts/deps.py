"""Print requirements declared in pyproject.toml, one per line (a pip requirements file).

    python scripts/deps.py --build test     # build requirements, dependencies, the test extra
    python scripts/deps.py --all            # dependencies and every extra (make constraints)
    python scripts/deps.py bench            # dependencies and the bench extra

The Makefile installs what this prints with `pip install -c constraints.txt -r ...`, so the
versions are the pinned ones and the package itself is not built here: the editable build of the
C++ extension needs its own -C flags and happens in the Makefile's $(VENV)/.build-cpu step.
--build adds [build-system].requires (scikit-build-core, pybind11), which that build, run
with --no-build-isolation, takes from the venv. Runs on the venv's or the system's python3
(tomllib from 3.11; on 3.10 the copy of tomli that pip carries).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(
    pyproject: dict[str, Any], extras: list[str], build: bool = False, all_extras: bool = False
) -> list[str]:
    project = pyproject["project"]
    declared = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in declared]
    if unknown:
        raise SystemExit(f"deps: no extra {', '.join(unknown)} in pyproject.toml")
    out: list[str] = []
    if build:
        out += pyproject["build-system"]["requires"]
    out += project.get("dependencies", [])
    for extra in sorted(declared) if all_extras else extras:
        out += declared[extra]
    seen: set[str] = set()
    return [r for r in out if not (r in seen or seen.add(r))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="extras to add (test, aws, bench)")
    parser.add_argument("--build", action="store_true", help="add [build-system].requires")
    parser.add_argument("--all", action="store_true", help="every extra")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args(argv)
    with args.pyproject.open("rb") as f:
        pyproject = tomllib.load(f)
    for line in requirements(pyproject, args.extras, args.build, args.all):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

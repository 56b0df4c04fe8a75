"""What the tests import is declared, and declared once: every third-party module imported
under tests/ (at module level or inside a function) belongs to a distribution named in
[project.dependencies] or the `test` extra of pyproject.toml; the Makefile installs exactly
those (scripts/deps.py) at the versions in constraints.txt, which pins every one of them and
no installer (pip, setuptools, wheel)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/deps.py, what the Makefile runs, loaded without putting scripts/ on sys.path.
_spec = importlib.util.spec_from_file_location("semif_deps_script", ROOT / "scripts" / "deps.py")
assert _spec is not None and _spec.loader is not None
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)

# Modules of this repository that tests import: the package, the tests, the benchmarks, and the
# scripts (tests/test_gpu_prep.py puts scripts/ on sys.path).
LOCAL = {"semif_proxy", "tests", "bench"} | {p.stem for p in (ROOT / "scripts").glob("*.py")}
INSTALLERS = {"pip", "setuptools", "wheel", "distribute"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert found, requirement
    return canonical(found.group(1))


def pyproject() -> dict:
    return deps.tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared_for_tests() -> set[str]:
    return {requirement_name(r) for r in deps.requirements(pyproject(), ["test"])}


def top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def undeclared(imports: dict[str, set[str]], declared: set[str]) -> list[str]:
    """'module (files): why' for each third-party module no declared distribution provides."""
    providers = importlib.metadata.packages_distributions()
    bad = []
    for module, files in sorted(imports.items()):
        if module in sys.stdlib_module_names or module in LOCAL:
            continue
        dists = {canonical(d) for d in providers.get(module, [])}
        if not dists:
            bad.append(f"{module} ({', '.join(sorted(files))}): no installed distribution")
        elif not dists & declared:
            bad.append(f"{module} ({', '.join(sorted(files))}): from {sorted(dists)}, undeclared")
    return bad


def test_every_third_party_import_under_tests_is_declared() -> None:
    imports: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for module in top_level_imports(path):
            imports.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    assert {"pytest", "yaml", "playwright", "requests", "prometheus_client"} <= set(imports)
    assert undeclared(imports, declared_for_tests()) == []


def test_an_undeclared_import_is_caught(tmp_path: Path) -> None:
    """The check itself: a test importing a module the extras do not name fails it."""
    module = tmp_path / "test_x.py"
    module.write_text("import json\nimport yaml\n\ndef f():\n    from requests import get\n")
    found = {m: {"test_x.py"} for m in top_level_imports(module)}
    assert found.keys() == {"json", "yaml", "requests"}
    declared = declared_for_tests() - {"requests"}
    assert undeclared(found, declared) == ["requests (test_x.py): from ['requests'], undeclared"]
    assert undeclared({"no_such_module_zz9": {"t.py"}}, declared) == [
        "no_such_module_zz9 (t.py): no installed distribution"
    ]


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonical(name)] = version
    return pins


def test_constraints_pin_every_declared_requirement_and_no_installer() -> None:
    pins = constraints()
    assert not INSTALLERS & set(pins), sorted(INSTALLERS & set(pins))
    every = deps.requirements(pyproject(), [], build=True, all_extras=True)
    assert {"scikit-build-core", "pybind11", "prometheus-client"} <= {
        requirement_name(r) for r in every
    }
    missing = sorted({requirement_name(r) for r in every} - set(pins))
    assert missing == [], f"not pinned in constraints.txt: {missing} (make constraints)"
    lines = [li.lower() for li in (ROOT / "constraints.txt").read_text().splitlines()]
    pinned = [li for li in lines if not li.startswith("#")]
    assert pinned == sorted(pinned), "constraints.txt is sorted as pip freeze sorts it"


def make_dry_run(*args: str) -> list[str]:
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_make_installs_the_declared_requirements_without_building(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines = make_dry_run("-B", f"VENV={venv}", f"{venv}/.deps")
    pip_lines = [li for li in lines if " -m pip install" in li]
    assert pip_lines, lines
    for line in pip_lines:
        assert "-c constraints.txt" in line, line
        # Requirements only: nothing names the package (`.`, `-e .`, `.[test]`).
        assert not re.search(r"(^|\s)(-e\s+)?['\"]?\.(\[[^\]]*\])?['\"]?(\s|$)", line), line
    [written] = [li for li in lines if "scripts/deps.py" in li]
    assert written.endswith(f"--build test > {venv}/requirements.txt"), written
    assert any(f"-r {venv}/requirements.txt" in li for li in pip_lines), pip_lines
    # What scripts/deps.py hands pip: the build requirements, the dependencies, the test extra.
    printed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "deps.py"), "--build", "test"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    project = pyproject()
    expected = [
        *project["build-system"]["requires"],
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["test"],
    ]
    assert printed == list(dict.fromkeys(expected))


def test_make_constraints_writes_no_installer_pins() -> None:
    lines = "\n".join(make_dry_run("constraints"))
    assert "scripts/deps.py --build --all" in lines
    freeze = lines[lines.index("pip freeze") :]
    assert "--all" not in freeze.split("\n")[0]
    assert "grep -viE '^(pip|setuptools|wheel|distribute)=='" in freeze


@pytest.mark.parametrize("extra", ["nope"])
def test_deps_refuses_an_unknown_extra(extra: str) -> None:
    with pytest.raises(SystemExit, match=f"no extra {extra}"):
        deps.requirements(pyproject(), [extra])

"""The package's import rule (semif_proxy/__init__.py), read from the code: every import
statement of every module, at module level, inside functions and under TYPE_CHECKING alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "semif_proxy"
GROUND = {"errors", "logs", "redact", "readout", "jsonl_files", "progress"}
COMMANDS = {"cli", "entrypoint"}
LOWER = {"cpu", "calibration", "model", "llama_server"}
# room -> rooms (first component under semif_proxy, or a third-party top-level name) it must
# never import.
FORBIDDEN: dict[str, set[str]] = {
    "engine": {"http", "api", "eval", "deploy", "testing", "aiohttp", "pydantic", *COMMANDS},
    "api": {"http", "eval", "deploy", "testing", "aiohttp", *COMMANDS},
    **{room: {"http", "api", "eval", "deploy", "testing", *COMMANDS} for room in LOWER},
    "eval": {"http", "testing"},
    "deploy": {"http", "testing"},
    "http": {"testing"},
}


def room_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, target): a module of the package as its first component under semif_proxy
    ('engine', 'errors', ...), or a third-party package's top-level name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, target(alias.name)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package_parts[: len(package_parts) - node.level]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "semif_proxy":
                for alias in node.names:
                    found.append((node.lineno, alias.name))
            else:
                found.append((node.lineno, target(module)))
    return found


def target(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "semif_proxy":
        return parts[1] if len(parts) > 1 else "semif_proxy"
    return parts[0]


MODULES = sorted(PACKAGE.rglob("*.py"))


def violations(path: Path) -> list[str]:
    room = room_of(path)
    bad = []
    for line, name in imported(path):
        if room in GROUND:
            internal = (PACKAGE / f"{name}.py").exists() or (PACKAGE / name).is_dir()
            if internal and name not in GROUND and name != "__version__":
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} ground imports {name}")
        elif name in FORBIDDEN.get(room, set()) and name != room:
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} {room}/ imports {name}")
    return bad


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_keeps_the_import_rule(path):
    assert violations(path) == []


def test_the_rule_catches_a_forbidden_arrow(tmp_path, monkeypatch):
    """The checker itself: an engine module that imports the HTTP layer, an API module that
    imports aiohttp, and a ground module that imports the engine are each reported."""
    fake = tmp_path / "semif_proxy"
    for room in ("engine", "api", "http"):
        (fake / room).mkdir(parents=True)
    (fake / "engine" / "worker.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from semif_proxy.http.keys import SETTINGS\n"
    )
    (fake / "api" / "svc.py").write_text("def f():\n    from aiohttp import web\n")
    (fake / "errors.py").write_text("from semif_proxy import engine\n")
    (fake / "http" / "app.py").write_text("from semif_proxy.api import svc\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert violations(fake / "engine" / "worker.py") == [
        "semif_proxy/engine/worker.py:3 engine/ imports http"
    ]
    assert violations(fake / "api" / "svc.py") == ["semif_proxy/api/svc.py:2 api/ imports aiohttp"]
    assert violations(fake / "errors.py") == ["semif_proxy/errors.py:1 ground imports engine"]
    assert violations(fake / "http" / "app.py") == []


def test_the_package_is_in_rooms():
    """No more than the ground, settings, the commands and the self-check lie flat."""
    flat = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert flat <= GROUND | COMMANDS | {"settings", "selfcheck"}, flat

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
# room -> what it must never import: rooms of the package as "semif_proxy.<room>", other
# packages by their top-level name ("aiohttp"; the standard library's own `http` is not ours).
_NEVER_ABOVE = {f"semif_proxy.{room}" for room in ("http", "eval", "deploy", "testing", *COMMANDS)}
FORBIDDEN: dict[str, set[str]] = {
    "engine": {*_NEVER_ABOVE, "semif_proxy.api", "aiohttp", "pydantic"},
    "api": {*_NEVER_ABOVE, "aiohttp"},
    **{room: {*_NEVER_ABOVE, "semif_proxy.api"} for room in LOWER},
    "eval": {"semif_proxy.http", "semif_proxy.testing"},
    "deploy": {"semif_proxy.http", "semif_proxy.testing"},
    "http": {"semif_proxy.testing"},
}


def room_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, target): a module of the package as "semif_proxy.<first component>"
    ("semif_proxy.engine", "semif_proxy.errors", ...), any other as its top-level name."""
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
                    found.append((node.lineno, f"semif_proxy.{alias.name}"))
            else:
                found.append((node.lineno, target(module)))
    return found


def target(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "semif_proxy":
        return ".".join(parts[:2])
    return parts[0]


MODULES = sorted(PACKAGE.rglob("*.py"))


def violations(path: Path) -> list[str]:
    room = room_of(path)
    bad = []
    for line, name in imported(path):
        where = path.relative_to(PACKAGE.parent)
        if room in GROUND:
            own = name.removeprefix("semif_proxy.")
            internal = name.startswith("semif_proxy.") and (
                (PACKAGE / f"{own}.py").exists() or (PACKAGE / own).is_dir()
            )
            if internal and own not in GROUND:
                bad.append(f"{where}:{line} ground imports {own}")
        elif name in FORBIDDEN.get(room, set()) and name != f"semif_proxy.{room}":
            bad.append(f"{where}:{line} {room}/ imports {name.removeprefix('semif_proxy.')}")
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
    (fake / "api" / "client.py").write_text("import http.client\nfrom http import HTTPStatus\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert violations(fake / "engine" / "worker.py") == [
        "semif_proxy/engine/worker.py:3 engine/ imports http"
    ]
    assert violations(fake / "api" / "svc.py") == ["semif_proxy/api/svc.py:2 api/ imports aiohttp"]
    assert violations(fake / "errors.py") == ["semif_proxy/errors.py:1 ground imports engine"]
    assert violations(fake / "http" / "app.py") == []
    # The standard library's http is not the package's HTTP layer.
    assert violations(fake / "api" / "client.py") == []


def test_the_package_is_in_rooms():
    """No more than the ground, settings, the commands and the self-check lie flat."""
    flat = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert flat <= GROUND | COMMANDS | {"settings", "selfcheck"}, flat

"""The docs that are generated cannot drift: docs/configuration.md against the variables the
package reads, every generated page and table against what its generator writes now (run into
a temporary folder and compared), and the README's size and links."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PAGE = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"\b(?:SEMIF|SM_LLAMA_CPP)_[A-Z0-9_]*[A-Z0-9]\b")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _script("gen_config_docs")


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _stale(generated: Path, committed: Path) -> str:
    return (
        f"{committed.relative_to(ROOT)} differs from what its generator writes now: run "
        "`make docs` and commit the result"
    )


def test_every_variable_the_package_reads_is_documented(gen: ModuleType) -> None:
    page = CONFIG_PAGE.read_text()
    documented = set(NAME.findall(page)) | set(re.findall(r"`([A-Z][A-Z0-9_]+)`", page))
    read = set(gen.mentions())
    main, _ = gen.all_rows()
    read |= {r.var for r in main} | {a for r in main for a in r.aliases}
    missing = sorted(read - documented)
    assert not missing, f"read by the package, missing from docs/configuration.md: {missing}"


def test_every_documented_variable_still_exists(gen: ModuleType) -> None:
    documented = set(NAME.findall(CONFIG_PAGE.read_text()))
    gone = sorted(documented - gen.mentioned_anywhere())
    assert not gone, f"in docs/configuration.md, no longer in the package: {gone}"


def test_every_variable_has_a_description(gen: ModuleType) -> None:
    main, others = gen.all_rows()
    bare = [r.var for r in (*main, *others) if not r.what.strip()]
    assert not bare, (
        f"no description for {bare}: add a comment above the field in "
        "semif_proxy/settings/schema.py (or where it is read)"
    )


def test_the_generator_notes_are_still_needed(gen: ModuleType) -> None:
    """A note stands in for a missing comment: once the code has one, or the variable is gone,
    the note must go."""
    from semif_proxy import settings

    fields, _ = gen._settings_comments()
    by_var = {var: field for field, (var, _aliases) in settings.env.ENV_VARS.items()}
    anywhere = gen.mentioned_anywhere() | {var for var in by_var}
    for var, note in gen.NOTES.items():
        assert var in anywhere or var in gen.mentions(), f"NOTES[{var!r}]: no such variable"
        if "what" in note and var in by_var:
            assert not fields.get(by_var[var]), (
                f"NOTES[{var!r}]['what']: settings/schema.py now comments the field; drop the note"
            )
    for var in gen.FIRST_TEN:
        assert var in anywhere or var in gen.mentions(), f"FIRST_TEN: {var} is gone"


def test_configuration_page_and_readme_table_are_current(tmp_path: Path) -> None:
    _run("scripts/gen_config_docs.py", "--out", str(tmp_path))
    for rel in ("docs/configuration.md", "README.md"):
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), _stale(
            tmp_path / rel, ROOT / rel
        )


def test_benchmark_pages_are_current(tmp_path: Path) -> None:
    _run("-m", "bench.report", "--docs", "--no-plots", "--out", str(tmp_path))
    for rel in ("docs/benchmarks.md", "README.md", "docs/sagemaker.md"):
        if (tmp_path / rel).exists():
            assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), _stale(
                tmp_path / rel, ROOT / rel
            )
    assert (tmp_path / "docs" / "benchmarks.md").exists()


def test_plots_and_diagram_are_current(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="the plots need the bench extra (make docs installs it)"
    )
    _run("-m", "bench.report", "--docs", "--out", str(tmp_path))
    _run("scripts/gen_diagram.py", "--out", str(tmp_path))
    images = sorted((tmp_path / "docs" / "img").glob("*.png"))
    assert {p.name for p in images} >= {"paths.png", "floor.png", "shared.png", "accuracy.png"}
    for image in images:
        committed = ROOT / "docs" / "img" / image.name
        assert committed.exists() and committed.read_bytes() == image.read_bytes(), _stale(
            image, committed
        )


def test_the_readme_fits_five_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"

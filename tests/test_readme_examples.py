"""The examples of README.md and docs/api.md, run against the real server with the default
model, so that a changed response format (a key renamed or gone, an id, a number) fails here
instead of leaving the docs wrong.

An example is a ```bash block with a `curl ... localhost:8080/<path>` call (its `-H` headers,
and its body as `-d '<json>'` or `--data-binary @- <<'EOF'` lines) followed by a ```json (one
answer) or ```jsonl (one answer per line) block: the answer as the docs show it. The shown
answer may leave keys out (the real one may have more), never add one; strings are equal, or,
where the docs write `…`, the real string holds the parts around it in order; integers are
equal and floats within TOLERANCE, except timings, `created` and `threads` (the machine's),
whose type alone is checked. A ```python block with `# prints:` lines runs (localhost:8080
pointed at the test server) and must print those lines, numbers within TOLERANCE; a block
without them (boto3, SageMaker) is only compiled. The `semif-proxy calibrate` example of
docs/calibration.md runs on the results file it names and must print what the page shows.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from semif_proxy.testing.server import PRESETS, ProxyProcess

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "api.md", ROOT / "docs" / "calibration.md"]
URL = "localhost:8080"
# Probabilities and logits as the docs round them (4 decimals), and the last bits a different
# thread count may move.
TOLERANCE = 2e-3
# Values of these keys depend on the machine or the moment: their type is checked.
VARYING = re.compile(r"(_seconds|_ms|^created|^threads|^request_id)$")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass
class Example:
    page: str
    line: int
    path: str
    headers: dict[str, str]
    body: bytes
    answers: list[Any]

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line} {self.path}"


def _blocks(text: str) -> list[tuple[str, str, int]]:
    return [(m[1], m[2], text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _curl(script: str) -> tuple[str, dict[str, str], bytes] | None:
    call = re.search(rf"curl\b.*?{re.escape(URL)}(/\S*)", script)
    if call is None:
        return None
    headers = dict(
        (k.strip(), v.strip())
        for k, v in (h.split(":", 1) for h in re.findall(r"-H '([^']*)'", script))
    )
    if m := re.search(r"-d '(.*?)'", script, re.S):
        body = m[1].encode()
    elif m := re.search(r"--data-binary @- <<'(\w+)'\n(.*?)^\1$", script, re.S | re.M):
        body = m[2].encode()
    else:
        body = b""
    return call[1], headers, body


def examples(page: Path) -> list[Example]:
    text = page.read_text()
    blocks = _blocks(text)
    found = []
    for (lang, script, line), (answer_lang, answer, _) in itertools.pairwise(blocks):
        if lang != "bash" or (call := _curl(script)) is None:
            continue
        if answer_lang == "json":
            answers = [json.loads(answer)]
        elif answer_lang == "jsonl":
            answers = [json.loads(a) for a in answer.splitlines() if a.strip()]
        else:
            continue
        found.append(Example(page.relative_to(ROOT).as_posix(), line, *call, answers))
    return found


def python_blocks(page: Path) -> list[tuple[str, int, str, list[str]]]:
    out = []
    for lang, code, line in _blocks(page.read_text()):
        if lang == "python":
            prints = re.findall(r"^# prints: (.*)$", code, re.M)
            out.append((page.relative_to(ROOT).as_posix(), line, code, prints))
    return out


def same(shown: Any, real: Any, where: str = "", key: str = "") -> None:
    """The shown answer is the real one, abbreviated (see the module's docstring)."""
    if VARYING.search(key):
        numbers = isinstance(real, (int, float)) and isinstance(shown, (int, float))
        assert numbers or type(real) is type(shown), f"{where}: {real!r} is not like {shown!r}"
        return
    if isinstance(shown, dict):
        assert isinstance(real, dict), f"{where}: {real!r} is not an object"
        for k, v in shown.items():
            assert k in real, f"{where}: the answer has no {k!r} (it has {sorted(real)})"
            same(v, real[k], f"{where}.{k}", k)
    elif isinstance(shown, list):
        assert isinstance(real, list) and len(real) == len(shown), f"{where}: {real!r}"
        for i, (a, b) in enumerate(zip(shown, real)):
            same(a, b, f"{where}[{i}]", key)
    elif isinstance(shown, str) and "…" in shown:
        assert isinstance(real, str), f"{where}: {real!r}"
        pattern = ".*".join(re.escape(part) for part in shown.split("…"))
        assert re.fullmatch(pattern, real, re.S), f"{where}: {real!r} is not {shown!r}"
    elif shown is None or isinstance(shown, (bool, str, int)):
        assert real == shown and type(real) is type(shown), f"{where}: {real!r} != {shown!r}"
    elif isinstance(shown, float):
        assert isinstance(real, (int, float)), f"{where}: {real!r}"
        assert math.isclose(real, shown, rel_tol=1e-4, abs_tol=TOLERANCE), (
            f"{where}: {real!r} is not {shown!r}"
        )
    else:
        raise AssertionError(f"{where}: cannot compare {shown!r}")


def same_line(shown: str, real: str) -> None:
    """A printed line: the same words, numbers within TOLERANCE."""
    a, b = shown.split(), real.split()
    assert len(a) == len(b), f"printed {real!r}, the docs say {shown!r}"
    for x, y in zip(a, b):
        try:
            assert math.isclose(float(x), float(y), abs_tol=TOLERANCE), f"{real!r} vs {shown!r}"
        except ValueError:
            assert x == y, f"printed {real!r}, the docs say {shown!r}"


ALL = [e for page in PAGES if page.exists() for e in examples(page)]
PYTHON = [b for page in PAGES if page.exists() for b in python_blocks(page)]


@pytest.fixture(scope="module")
def server(model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """`make run`'s server: the product's defaults (threads, slots, context)."""
    log = tmp_path_factory.mktemp("readme") / "proxy.log"
    env = {**PRESETS["defaults"], "SM_LLAMA_CPP_CTX_SIZE": None}
    proxy = ProxyProcess(model_path, env, log_path=log).start()
    yield proxy
    proxy.stop()


def test_the_readme_shows_a_decision_and_a_chat() -> None:
    paths = {e.path for e in ALL if e.page == "README.md"}
    assert "/v1/decisions" in paths and "/v1/chat/completions" in paths, paths
    assert any("# prints:" in code for page, _, code, _ in PYTHON if page == "README.md")


@pytest.mark.parametrize("example", ALL, ids=[e.name for e in ALL])
def test_curl_example(server: ProxyProcess, example: Example) -> None:
    reply = server.call(
        "POST", example.path, raw=example.body, headers=example.headers, timeout=120
    )
    if len(example.answers) == 1 and "jsonlines" not in example.headers.get("Content-Type", ""):
        real = [reply.json()]
    else:
        real = [json.loads(line) for line in reply.body.decode().splitlines()]
    assert len(real) == len(example.answers), reply.body[:500]
    for i, (shown, got) in enumerate(zip(example.answers, real)):
        same(shown, got, f"{example.name} answer {i + 1}")


@pytest.mark.parametrize("block", PYTHON, ids=[f"{b[0]}:{b[1]}" for b in PYTHON])
def test_python_example(server: ProxyProcess, block: tuple[str, int, str, list[str]]) -> None:
    page, line, code, prints = block
    compile(code, f"{page}:{line}", "exec")
    if not prints:
        return  # AWS calls: compiled only
    code = code.replace(f"http://{URL}", server.url)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(prints), done.stdout
    for shown, real in zip(prints, lines):
        same_line(shown, real)


def test_calibrate_example(tmp_path: Path) -> None:
    """docs/calibration.md: the commands after `--target-accuracy`, and their output."""
    blocks = _blocks((ROOT / "docs" / "calibration.md").read_text())
    pairs = [
        (script, shown)
        for (lang, script, _), (out_lang, shown, _) in itertools.pairwise(blocks)
        if lang == "bash" and out_lang == "text" and "semif-proxy calibrate --pred" in script
    ]
    assert pairs, "docs/calibration.md has no `semif-proxy calibrate` example"
    script, shown = pairs[0]
    results = json.loads((ROOT / "bench" / "results" / "jevbench-smollm2.json").read_text())
    rows = [json.dumps(r) for r in results["rows"] if r.get("option_logits")]
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    command = re.search(r"^semif-proxy (calibrate .*)$", script, re.M)
    assert command is not None
    done = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", *command[1].split()],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert done.stdout.strip().splitlines() == shown.strip().splitlines()

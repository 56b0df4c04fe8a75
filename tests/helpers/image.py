"""What the images run, read from the Dockerfiles and .dockerignore, to run it without Docker:
the runtime stage's ENV, ENTRYPOINT and HEALTHCHECK, and the build context Docker would send."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# One Dockerfile for both images (its VARIANT build argument: cpu or gpu).
DOCKERFILES = {"cpu": ROOT / "container" / "Dockerfile"}
# Where the Dockerfiles put the venv (build-extension.sh's second argument); tests relocate it.
IMAGE_VENV = "/opt/semif"


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def runtime(self) -> Stage:
        return self.stages[-1]

    def entrypoint(self) -> list[str]:
        return list(json.loads(self.runtime.values("ENTRYPOINT")[-1]))

    def healthcheck(self) -> list[str]:
        [check] = self.runtime.values("HEALTHCHECK")
        return list(json.loads(check.split(" CMD ", 1)[1]))

    def env(self, base: dict[str, str], venv: Path) -> dict[str, str]:
        """The runtime stage's environment on top of the base's, as Docker expands it, with the
        image's venv at `venv` instead of /opt/semif."""
        env = dict(base)
        for line in self.runtime.values("ENV"):
            for item in shlex.split(line):
                key, _, value = item.partition("=")
                value = re.sub(
                    r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value
                )
                env[key] = value.replace(IMAGE_VENV, str(venv))
        return env


def parse(path: Path) -> Dockerfile:
    """Global ARGs and the stages, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else ""
            stages.append(Stage(parts[0], name))
        elif not stages and keyword == "ARG":
            key, _, default = rest.partition("=")
            global_args[key] = default
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return Dockerfile(global_args, stages)


def _pattern(rule: str) -> re.Pattern[str]:
    rule = rule.strip("/")
    out = ""
    i = 0
    while i < len(rule):
        if rule.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif rule.startswith("**", i):
            out, i = out + ".*", i + 2
        elif rule[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif rule[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(rule[i]), i + 1
    return re.compile(out)


def build_context(dest: Path, root: Path = ROOT) -> Path:
    """Copy what `docker build <root>` sends: every path .dockerignore does not exclude (the last
    matching rule wins; a rule matches a path or one of its parent folders; `!` re-includes)."""
    rules: list[tuple[bool, str, re.Pattern[str]]] = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            text = line.lstrip("!").strip("/")
            rules.append((negate, text, _pattern(text)))

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        state = False
        for negate, _, pattern in rules:
            if any(pattern.fullmatch(p) for p in prefixes):
                state = not negate
        return state

    def may_hold_included(rel: str) -> bool:
        return any(negate and text.startswith(rel + "/") for negate, text, _ in rules)

    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [
            d for d in dirnames if not excluded(prefix + d) or may_hold_included(prefix + d)
        ]
        for name in filenames:
            rel = prefix + name
            if not excluded(rel):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(dirpath) / name, target)
    return dest

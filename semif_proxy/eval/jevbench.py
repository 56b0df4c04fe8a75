"""JevBench task files: reading them, turning a row into a System One request, scoring answers.

Shared by the HTTP benchmark (`python -m bench jevbench`) and the slow test that runs all 231
public tasks. The task files live beside the checkout (`../shared/jevbench`); nothing here is
needed to serve.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# <checkout>/../shared/jevbench: this file is <checkout>/semif_proxy/eval/jevbench.py.
DEFAULT_DIR = Path(__file__).resolve().parents[3] / "shared" / "jevbench"


@dataclass(frozen=True)
class Task:
    file: str  # file stem: easy, original, hard
    row: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def kind(self) -> str:
        return str(self.row["question"]["type"])

    @property
    def expected(self) -> str:
        return str(self.row["expected"])

    def request(self, model: str = "jev-latest") -> dict[str, Any]:
        return {
            "model": model,
            "state": self.row["state"],
            "questions": {"q": self.row["question"]},
        }


def read_tasks(paths: Iterable[Path]) -> Iterator[Task]:
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield Task(path.stem, json.loads(line))


def task_files(directory: Path = DEFAULT_DIR) -> list[Path]:
    order = {"easy": 0, "original": 1, "hard": 2}
    return sorted(directory.glob("*.jsonl"), key=lambda p: (order.get(p.stem, 9), p.name))


def predicted_label(answer: dict[str, Any]) -> str:
    """The argmax label in JevBench's terms (noul: "yes" when P(true) > 0.5)."""
    if answer["type"] == "noul":
        return "yes" if answer["noul"] > 0.5 else "no"
    probs = answer["probabilities"]
    return max(probs, key=probs.get)


def label_probabilities(answer: dict[str, Any]) -> dict[str, float]:
    if answer["type"] == "noul":
        return {"yes": answer["noul"], "no": 1.0 - answer["noul"]}
    return dict(answer["probabilities"])

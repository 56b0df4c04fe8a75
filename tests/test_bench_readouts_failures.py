"""bench/readouts_failures.py: which run is shown, and what its failing rows are said to have
in common, checked against rows built by hand and counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

from bench import readouts_failures as failures


def _row(config: str, i: int, correct: bool, **extra) -> dict:
    row = {
        "config": config,
        "permutations": "1",
        "split": "hard" if i % 2 else "easy",
        "id": f"t{i}",
        "type": "choice",
        "family": "multi_hop" if i % 2 else "intent",
        "correct": correct,
        "seconds": 1.0,
        "input_tokens": 100 * (i + 1),
        "probabilities": {"a": 0.6, "b": 0.3, "c": 0.1},
        "p_predicted": 0.6,
        "p_expected": 0.6 if correct else 0.3,
    }
    return row | extra


def _runs(tasks: int, right: dict[str, int], seconds: dict[str, float] | None = None) -> dict:
    out = {}
    for name, k in right.items():
        out[name] = {
            ("s", f"t{i}"): _row(name, i, i < k, seconds=(seconds or {}).get(name, 1.0))
            for i in range(tasks)
        }
    return out


def test_the_best_run_answered_every_task_and_ties_go_to_the_cheaper(monkeypatch) -> None:
    monkeypatch.setattr(failures, "TASKS", 4)
    # b has more right answers but did not answer all four tasks: it cannot be shown.
    runs = _runs(4, {"a@1": 2, "c@1": 3})
    runs["b@1"] = {("s", "t0"): _row("b", 0, True)}
    assert failures.best_run(runs) == "c@1"
    tied = _runs(4, {"slow@1": 3, "fast@1": 3}, seconds={"slow@1": 5.0, "fast@1": 1.0})
    assert failures.best_run(tied) == "fast@1"
    assert failures.best_run({"b@1": runs["b@1"]}) is None


def test_traits_count_what_the_failing_rows_share() -> None:
    # Six rows: 0-3 right, 4 and 5 wrong; row 4 has the expected label second (p 0.3 of
    # 0.6 / 0.3 / 0.1), row 5 has it last. Odd rows are hard. Letters were wrong on 3 and 5.
    rows = [_row("x", i, i < 4) for i in range(6)]
    rows[5]["p_expected"] = 0.1
    rows[5]["p_predicted"] = 0.4
    letters = {(r["split"], r["id"]): {"correct": r["id"] not in ("t3", "t5")} for r in rows}
    t = failures.traits(rows, letters)
    f, ok = t["failing"], t["right"]
    assert (f["n"], ok["n"]) == (2, 4)
    assert (f["hard"], ok["hard"]) == (1, 2)  # t5; t1, t3
    assert f["input_tokens_p50"] == 550  # 500 and 600
    assert ok["input_tokens_p50"] == 250  # 100..400
    assert f["p_predicted_p50"] == 0.5  # 0.6 and 0.4
    assert f["second"] == 1
    assert f["letters_wrong"] == 1
    assert ok["letters_wrong"] == 1


def test_the_section_says_plainly_whether_the_goal_is_reached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(failures, "TASKS", 4)
    rows_file = tmp_path / f"readouts-{failures.REALISTIC}.jsonl"

    def write(right: int) -> list[str]:
        lines = [json.dumps({"fingerprint": {"format": 1}})]
        lines += [json.dumps(_row("letters", i, i < 1)) for i in range(4)]
        lines += [json.dumps(_row("letters+contextual", i, i < right)) for i in range(4)]
        lines += [json.dumps(_row("deliberate", 2, True))]  # a run asked in part
        rows_file.write_text("\n".join(lines) + "\n")
        return failures.section(tmp_path)

    page = "\n".join(write(3))
    assert "`letters+contextual@1`: 3/4" in page
    assert "not reached, 136 short" in page
    # 3 of 4 against letters' 1 of 4 on the same tasks; no row was timed cold: no cost.
    assert "Against letters@1: +50.0 pt [" in page
    assert "at an unmeasured cost." in page
    # Per family: easy/intent holds t0 and t2 (letters right on t0; x right on both;
    # deliberate answered t2 only), hard/multi_hop t1 and t3 (x right on t1).
    assert "| letters@1 | letters+contextual@1 | deliberate@1 |" in page
    assert "| easy | intent | choice | 2 | 0.7 | 1 | 2 | 1/1 |" in page
    assert "| hard | multi_hop | choice | 2 | 0.7 | 0 | 1 | - |" in page
    assert "- hard: 1/2 right, 0.7 by chance" in page
    assert failures.section(tmp_path / "nothing") == []

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
    # Choices only: the yes/no goal has nothing to compare, so it is not judged.
    assert "| `letters@1` | all | - | 1/4 = 25.0 % [" in page
    assert "| 1/4 = 25.0 % [5, 70] | - | - | - |" in page and "reached |" not in page
    assert failures.section(tmp_path / "nothing") == []


def test_the_yes_no_goal_compares_yes_no_with_choices_per_split() -> None:
    def row(i: int, split: str, kind: str, correct: bool, expected: str = "a") -> dict:
        return _row("letters", i, correct, split=split, type=kind, expected=expected)

    # easy: yes/no 1 of 2 (the "no" one wrong), choices 2 of 2: not reached there. hard: yes/no
    # 2 of 2, choices 1 of 2, and a score row that counts as neither. All: 3/4 against 3/4,
    # equal: reached. By the answer expected: "yes" 2 of 2, "no" 1 of 2.
    rows = [
        row(0, "easy", "noul", True, "yes"),
        row(1, "easy", "noul", False, "no"),
        row(2, "easy", "choice", True),
        row(3, "easy", "choice", True),
        row(4, "hard", "noul", True, "no"),
        row(5, "hard", "noul", True, "yes"),
        row(6, "hard", "choice", False),
        row(7, "hard", "choice", True),
        row(8, "hard", "score", False),
    ]
    # Rates, not counts: y@1's 1/1 yes/no beats its 2/3 choices (more choices right), and
    # its hard split's 1/2 ties 2/4.
    other = [
        row(0, "easy", "noul", True, "yes"),
        *(row(i, "easy", "choice", i < 3) for i in (1, 2, 3)),
        row(4, "hard", "noul", True, "no"),
        row(5, "hard", "noul", False, "yes"),
        *(row(i, "hard", "choice", i < 8) for i in (6, 7, 8, 9)),
    ]
    runs = {
        "letters@1": {(r["split"], r["id"]): r for r in rows},
        "x@1": {("easy", "t2"): row(2, "easy", "choice", False)},
        "y@1": {(r["split"], r["id"]): r for r in other},
    }
    lines = failures.yes_no_goal(runs, ["letters@1", "x@1", "absent@1", "y@1"])
    assert all(x.count("|") == 8 for x in lines[2:-1])  # seven columns each
    table = {tuple(c.strip() for c in x.split("|")[1:3]): x for x in lines[4:-1]}

    def line(name: str, split: str) -> str:
        return table[(f"`{name}`", split)]

    assert set(table) == {
        ("`letters@1`", "all"),
        ("`letters@1`", "easy"),
        ("`letters@1`", "hard"),
        ("`x@1`", "all"),
        ("`x@1`", "easy"),
        ("`y@1`", "all"),
        ("`y@1`", "easy"),
        ("`y@1`", "hard"),
    }  # no original rows, no rows at all for absent@1: no line
    # Wilson 95 % of 3/4 is [0.30, 0.95], of 1/2 [0.09, 0.91], of 2/2 [0.34, 1.00].
    assert line("letters@1", "all").endswith(
        "| 3/4 = 75.0 % [30, 95] | 3/4 = 75.0 % [30, 95] | reached "
        "| 2/2 = 100.0 % [34, 100] | 1/2 = 50.0 % [9, 91] |"
    )
    assert "| 1/2 = 50.0 % [9, 91] | 2/2 = 100.0 % [34, 100] | not reached |" in line(
        "letters@1", "easy"
    )
    assert "| 2/2 = 100.0 % [34, 100] | 1/2 = 50.0 % [9, 91] | reached |" in line(
        "letters@1", "hard"
    )
    assert line("x@1", "easy").endswith("| - | 0/1 = 0.0 % [0, 79] | - | - | - |")
    assert "| 1/1 = 100.0 % [21, 100] | 2/3 = 66.7 % [21, 94] | reached |" in line("y@1", "easy")
    assert "| 1/2 = 50.0 % [9, 91] | 2/4 = 50.0 % [15, 85] | reached |" in line("y@1", "hard")
    # All: 2/3 yes/no against 4/7 choices (67 % against 57 %).
    assert "| 2/3 = 66.7 % [21, 94] | 4/7 = 57.1 % [25, 84] | reached |" in line("y@1", "all")
    assert failures.yes_no_goal(runs, ["absent@1"]) == []

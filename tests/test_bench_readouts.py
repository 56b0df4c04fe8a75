"""`python -m bench.readouts`: its statistics against independent references, docs/readouts.md
against what its generator writes now, and the runner (rows, summary, resume) on three
JevBench-like tasks with the small model."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from bench import readouts, readouts_rows
from bench.readouts_stats import ece, paired_bootstrap, percentile, wilson
from semif_proxy.calibration.temperature import ece as package_ece

ROOT = Path(__file__).resolve().parents[1]


# -- (a) the statistics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (8, 10, 0.490, 0.943),  # the textbook example
        # Newcombe (1998), Stat Med 17:857, Table II, method 3 (score interval, no correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (29, 29, 0.8830, 1.0),
    ],
)
def test_wilson_matches_published_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=6e-4)


def test_wilson_without_samples_says_nothing() -> None:
    assert wilson(0, 0) == (0.0, 1.0)


def test_paired_bootstrap_agrees_with_the_normal_approximation() -> None:
    rng = np.random.default_rng(7)
    a = (rng.random(600) < 0.6).astype(float)
    b = (rng.random(600) < 0.5).astype(float)
    mean, lo, hi = paired_bootstrap(list(a), list(b))
    d = a - b
    half = 1.959964 * d.std(ddof=1) / np.sqrt(len(d))
    assert mean == pytest.approx(d.mean())
    assert lo == pytest.approx(d.mean() - half, abs=0.01)
    assert hi == pytest.approx(d.mean() + half, abs=0.01)
    assert paired_bootstrap(list(a), list(b)) == (mean, lo, hi)  # a fixed seed


def test_paired_bootstrap_edge_cases() -> None:
    assert paired_bootstrap([1.0] * 5, [0.0] * 5) == (1.0, 1.0, 1.0)
    assert paired_bootstrap([], []) is None
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [])


def test_ece_by_hand_and_against_the_package() -> None:
    # Bin 9: accuracy 0.5, confidence 0.95; bin 5: accuracy 1, confidence 0.55; half each.
    assert ece([0.95, 0.95, 0.55, 0.55], [True, False, True, True]) == pytest.approx(0.45)
    assert ece([1.0, 0.0], [True, False]) == pytest.approx(0.0)
    assert ece([], []) == 0.0
    rng = np.random.default_rng(3)
    conf = list(rng.random(500))
    hits = list(rng.random(500) < 0.7)
    assert ece(conf, hits) == pytest.approx(package_ece(conf, hits), abs=1e-12)


def test_percentile_is_numpys_linear() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0, 10, 50, 95, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


# -- (b) the generated page -----------------------------------------------------------------


def test_readouts_page_is_current(tmp_path: Path) -> None:
    assert readouts.main(["--docs", "--out", str(tmp_path)]) == 0
    page = tmp_path / "docs" / "readouts.md"
    assert page.read_text() == (ROOT / "docs" / "readouts.md").read_text(), (
        "docs/readouts.md differs from what `python -m bench.readouts --docs` writes now"
    )
    plot = tmp_path / "docs" / "img" / "readouts.png"
    if plot.exists() and importlib.util.find_spec("matplotlib"):
        assert plot.read_bytes() == (ROOT / "docs" / "img" / "readouts.png").read_bytes()


# -- (c) the runner -------------------------------------------------------------------------

TASKS = [
    {
        "id": "mini-noul-0",
        "family": "policy",
        "expected": "no",
        "question": {"type": "noul", "instructions": "Is the refund allowed? Receipt required."},
        "state": "The customer has no receipt.",
    },
    {
        "id": "mini-choice-0",
        "family": "intent",
        "expected": "cancel",
        "question": {
            "type": "choice",
            "instructions": "Which intent does the message express?",
            "criteria": {"cancel": "Wants to cancel an order", "track": "Asks where it is"},
        },
        "state": "Please cancel my order, I do not need it.",
    },
    {
        "id": "mini-score-0",
        "family": "ordinal",
        "expected": 0,
        "question": {
            "type": "score",
            "instructions": "Rate the impact.",
            "criteria": ["Cosmetic only", "One user blocked", "Data lost"],
        },
        "state": "An icon is misaligned; everything works.",
    },
]


def _run(config: str, n: int, lo: float, cost: float | None) -> dict:
    c = {"n": n, "correct": n // 2, "accuracy": 0.5, "wilson95": [0.4, 0.6]}
    if config != "letters":
        c["vs_letters"] = {"pairs": n, "difference": lo + 0.05, "bootstrap95": [lo, lo + 0.1]}
        c["vs_letters"] |= {"cost_ratio": cost, "cost_pairs": 10, "cpu_cost_ratio": cost}
    return {"config": config, "permutations": "1", "by": {"all": {"all": c}}}


@pytest.mark.parametrize(
    ("letters_n", "n", "lo", "cost", "verdict"),
    [
        (231, 231, 0.02, 1.1, "meets the rule"),
        (130, 231, 0.02, 1.1, "not yet: letters answered 130 of 231"),  # pairs are not all
        (231, 200, 0.02, 1.1, "not yet: 200 of 231 tasks answered"),
        (231, 231, 0.0, 1.1, "not yet: its interval reaches zero"),
        (231, 231, 0.02, 1.6, "not yet: cost 1.60x"),
        (231, 231, 0.02, None, "not yet: no cost measured"),
    ],
)
def test_a_readout_earns_the_default_only_over_every_paired_task(
    letters_n: int, n: int, lo: float, cost: float | None, verdict: str
) -> None:
    from bench.readouts_docs import verdicts

    runs = {"letters@1": _run("letters", letters_n, 0, None), "x@1": _run("x", n, lo, cost)}
    lines = verdicts([{"tag": "qwen2.5-1.5b", "runs": runs}])
    [line] = [line for line in lines if line.startswith("- x@1, all")]
    assert line.endswith(verdict), line
    met = any(line.startswith("Met by: x (all).") for line in lines)
    assert met == (verdict == "meets the rule")


def mini_run(tmp_path: Path, model_path: Path, tag: str, configs: str) -> tuple[Path, list[str]]:
    """The results folder and the argv of a run of TASKS (the easy split) in one order."""
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    (tasks_dir / "easy.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    out = tmp_path / "results"
    argv = [
        *("--model", str(model_path), "--tag", tag, "--permutations", "1"),
        *("--configs", configs, "--splits", "easy"),
        *("--tasks-dir", str(tasks_dir), "--results-dir", str(out)),
        *("--repack", "off"),
    ]
    return out, argv


# Two model loads and six questions (two prompts each, continuation's several branches), then
# one asked again: about a minute and a half on two free cores, more on a shared machine.
@pytest.mark.timeout(600)
def test_runner_writes_rows_and_summary_and_resumes(tmp_path: Path, model_path: Path) -> None:
    out, argv = mini_run(tmp_path, model_path, "mini", "letters,continuation-mean")
    assert readouts.main(argv) == 0
    rows_file = out / "readouts-mini.jsonl"
    lines = [json.loads(x) for x in rows_file.read_text().splitlines()]
    assert "fingerprint" in lines[0]
    rows = lines[1:]
    assert len(rows) == 6
    assert {(r["config"], r["id"]) for r in rows} == {
        (c, t["id"]) for c in ("letters", "continuation-mean") for t in TASKS
    }
    for r in rows:
        assert "error" not in r, r
        assert r["correct"] == (r["predicted"] == r["expected"])
        assert 0.0 <= r["p_expected"] <= r["p_predicted"] == max(r["probabilities"].values())
        assert r["seconds"] > 0 and r["input_tokens"] > 0
        assert r["split"] == "easy" and r["family"] and r["type"] in ("noul", "choice", "score")
        assert r["repacked"] is False  # the layout as pinned (--repack off)
    assert {r["readout"] for r in rows if r["config"] == "continuation-mean"} == {
        "continuation-logprobs"
    }
    summary = json.loads((out / "readouts-mini.json").read_text())
    cont = summary["runs"]["continuation-mean@1"]["by"]["all"]["all"]
    assert cont["n"] == 3 and cont["vs_letters"]["pairs"] == 3
    assert summary["runs"]["letters@1"]["by"]["easy"]["noul"]["n"] == 1

    before = rows_file.read_text()
    assert readouts.main(argv) == 0  # every row is there: nothing asked, nothing added
    assert rows_file.read_text() == before

    # --recold asks again only a row that was not timed cold (rows from before cold starts);
    # the engine is exact, so the new row's numbers are the old one's. A config that copies
    # that row (direct asks a choice question as letters does) and holds a copy of an older
    # letters row (timed before cold starts, as the row it copied) follows it in the same run:
    # copied anew, no engine work.
    choice = next(r for r in rows if r["config"] == "letters" and r["type"] == "choice")
    warm = dict(choice, cold=False)
    older = dict(warm, config="direct", copied_from="letters", p_expected=-1.0)
    rows_file.write_text(before + json.dumps(warm) + "\n" + json.dumps(older) + "\n")
    assert readouts.main([*argv, "--recold"]) == 0
    again = [json.loads(x) for x in rows_file.read_text().splitlines()[9:]]
    assert [(r["config"], r["id"], r["cold"]) for r in again] == [
        ("letters", choice["id"], True),
        ("direct", choice["id"], True),
    ]
    assert again[0]["probabilities"] == warm["probabilities"]
    assert again[1] == again[0] | {"config": "direct", "copied_from": "letters"}
    # A run with nothing to ask copies anew too; once, then nothing.
    lines = rows_file.read_text()
    rows_file.write_text(lines + json.dumps(older) + "\n")
    assert readouts.main(argv) == 0
    [copy] = [json.loads(x) for x in rows_file.read_text().splitlines()[12:]]
    assert copy == again[1]
    lines = rows_file.read_text()
    assert readouts.main([*argv, "--recold"]) == 0
    assert rows_file.read_text() == lines
    before = rows_file.read_text()

    other = json.loads(before.splitlines()[0])
    other["fingerprint"]["model_sha256"] = "0" * 64
    rows_file.write_text(json.dumps(other) + "\n" + "".join(before.splitlines(True)[1:]))
    assert readouts.main(argv) == 2  # rows of another model: refused, untouched
    assert len(rows_file.read_text().splitlines()) == len(before.splitlines())

    # The continuation readout's version changed since its rows were asked: those rows are
    # dropped and asked again, the letters rows stay as they were.
    header = json.loads(before.splitlines()[0])
    header["fingerprint"]["prompt_versions"]["continuation"] = "semif-continuation-v0"
    body = before.splitlines(True)[1:]
    stale = [
        json.dumps({**json.loads(x), "prompt_version": "semif-continuation-v0"}) + "\n"
        if json.loads(x)["config"] == "continuation-mean"
        else x
        for x in body
    ]
    rows_file.write_text(json.dumps(header) + "\n" + "".join(stale))
    assert readouts.main(argv) == 0
    redone = [json.loads(x) for x in rows_file.read_text().splitlines()]
    assert redone[0] == json.loads(before.splitlines()[0])  # the current versions
    letters = {(r["config"], r["id"]): r for r in map(json.loads, body)}  # a later line wins
    assert {(r["config"], r["id"]): r for r in redone[1:] if r["config"] == "letters"} == {
        k: r for k, r in letters.items() if k[0] == "letters"
    }
    cont = [r for r in redone[1:] if r["config"] == "continuation-mean"]
    assert len(cont) == 3 and {r["prompt_version"] for r in cont} == {"semif-continuation-v2"}

    # One family, deliberate: its row keeps what the model wrote (tokens and their seconds).
    rows_file.write_text(before)
    at = argv.index("--configs")
    picked = [*argv[:at], *argv[at + 2 :], "--configs", "deliberate", "--families", "intent"]
    picked += ["--repack", "on"]  # the last one given counts
    assert readouts.main(picked) == 0
    [row] = [json.loads(x) for x in rows_file.read_text().splitlines()[len(before.splitlines()) :]]
    assert (row["config"], row["id"], row["readout"]) == (
        "deliberate",
        "mini-choice-0",
        "deliberate-letter-logits",
    )
    timing = row["engine_timing"]
    assert 1 <= timing["generated_tokens"] <= 64 and timing["generation_seconds"] > 0

    # A deliberate row answered before the reasoning came after the shared prefix (no
    # engine_cost): its numbers count, its seconds do not, and --recold asks it again, with the
    # same numbers (the change is exact).
    assert row["engine_cost"] == 2 and readouts_rows.timed(row) and readouts_rows.current(row)
    assert row["engine_numbers"] == readouts_rows.ENGINE_NUMBERS
    assert row["repacked"] is True  # the layout it was answered on, as pinned
    stale = {k: v for k, v in row.items() if k != "engine_cost"}
    assert not readouts_rows.timed(stale) and readouts_rows.timed(dict(stale, engine_cost=2))
    rows_file.write_text(rows_file.read_text() + json.dumps(stale) + "\n")
    assert readouts.main([*picked, "--summary"]) == 0
    summary = json.loads((out / "readouts-mini.json").read_text())
    run = summary["runs"]["deliberate@1"]["by"]["all"]["all"]
    assert run["n"] == 1 and run["latency_p50"] is None  # counted, not timed
    assert run["vs_letters"]["pairs"] == 1 and run["vs_letters"]["cost_pairs"] == 0
    lines = len(rows_file.read_text().splitlines())
    assert readouts.main([*picked, "--recold"]) == 0
    redone = [json.loads(x) for x in rows_file.read_text().splitlines()]
    assert len(redone) == lines + 1 and redone[-1]["engine_cost"] == 2
    assert redone[-1]["probabilities"] == stale["probabilities"]
    assert redone[-1]["engine_timing"]["generated_tokens"] == timing["generated_tokens"]


# Two model loads and five questions.
@pytest.mark.timeout(600)
def test_a_run_killed_after_asking_a_twin_again_still_copies_it_on(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM ends a run through SystemExit (its handler): a row asked again before it is
    copied on to the configs that copy it, and the summary is written, as the run unwinds."""
    out, argv = mini_run(tmp_path, model_path, "kill", "letters")
    assert readouts.main(argv) == 0
    rows_file = out / "readouts-kill.jsonl"
    rows = [json.loads(x) for x in rows_file.read_text().splitlines()[1:]]
    choice = next(r for r in rows if r["type"] == "choice")
    warm = [dict(r, cold=False) for r in rows]  # every letters row asked again under --recold
    older = dict(choice, cold=False, config="direct", copied_from="letters", p_expected=-1.0)
    rows_file.write_text(rows_file.read_text() + "".join(json.dumps(r) + "\n" for r in warm))
    rows_file.write_text(rows_file.read_text() + json.dumps(older) + "\n")
    (out / "readouts-kill.json").unlink()
    real = readouts.answer_row

    def killed_at_the_last_task(engine: object, task: readouts.Task, *more: str) -> dict:
        if task.id == TASKS[-1]["id"]:
            assert signal.getsignal(signal.SIGTERM) is not handler  # else pytest itself dies
            os.kill(os.getpid(), signal.SIGTERM)  # the run's own handler ends it
        return real(engine, task, *more)

    monkeypatch.setattr(readouts, "answer_row", killed_at_the_last_task)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as ended:
            readouts.main([*argv, "--recold"])
        assert ended.value.code == 143
        assert signal.getsignal(signal.SIGTERM) is handler  # the run's handler is gone
    finally:
        signal.signal(signal.SIGTERM, handler)  # not left to the rest of the session
    _, held = readouts_rows.read_rows(rows_file)
    asked = held[("letters", "1", "easy", choice["id"])]
    assert asked["cold"] is True and not held[("letters", "1", "easy", TASKS[-1]["id"])]["cold"]
    copy = held[("direct", "1", "easy", choice["id"])]
    assert copy == asked | {"config": "direct", "copied_from": "letters"}
    summary = json.loads((out / "readouts-kill.json").read_text())
    assert summary["runs"]["letters@1"]["by"]["all"]["all"]["n"] == len(TASKS)


@pytest.mark.timeout(600)
def test_a_step_that_fails_as_a_run_ends_does_not_stop_the_others(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copying on fails (a full disk, say): the summary is still written, then the error is
    raised; the rows asked stay in the file."""
    out, argv = mini_run(tmp_path, model_path, "steps", "letters")

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(readouts, "append_copies", full)
    with pytest.raises(OSError, match="No space"):
        readouts.main(argv)
    summary = json.loads((out / "readouts-steps.json").read_text())
    assert summary["runs"]["letters@1"]["by"]["all"]["all"]["n"] == len(TASKS)
    # Again with nothing left to ask (no engine loaded): the same ending.
    (out / "readouts-steps.json").unlink()
    with pytest.raises(OSError, match="No space"):
        readouts.main(argv)
    assert (out / "readouts-steps.json").exists()
    # Killed too: the run's own exit (143) comes out, not the copying's error, and the summary
    # is written.
    (out / "readouts-steps.json").unlink()
    real, handler = readouts.answer_row, signal.getsignal(signal.SIGTERM)

    def killed(engine: object, task: readouts.Task, *more: str) -> dict:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(engine, task, *more)

    monkeypatch.setattr(readouts, "answer_row", killed)
    try:
        with pytest.raises(SystemExit) as ended:
            readouts.main([*argv, "--recold", "--configs", "direct"])
        assert ended.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert (out / "readouts-steps.json").exists()


def test_rows_appended_after_a_line_a_kill_cut_short_start_on_a_line_of_their_own(
    tmp_path: Path,
) -> None:
    """A kill mid-write leaves the last line without its newline: the next run's rows start on
    a new line, so the cut line alone is lost (asked again), not the first row after it."""
    rows_file = tmp_path / "rows.jsonl"
    row = {"config": "letters", "permutations": "1", "split": "easy", "id": "a"}
    with readouts_rows.appending(rows_file) as f:  # no file yet
        f.write(json.dumps({"fingerprint": {"model": "m"}}) + "\n")
        f.write(json.dumps(row) + "\n")
    whole = rows_file.read_text()
    rows_file.write_text(whole + json.dumps(row | {"id": "b"})[:20])  # cut short
    for name in ("c", "d"):  # the second after a whole line: no blank line in between
        with readouts_rows.appending(rows_file) as f:
            f.write(json.dumps(row | {"id": name}) + "\n")
    header, rows = readouts_rows.read_rows(rows_file)
    assert header == {"model": "m"}
    assert sorted(k[-1] for k in rows) == ["a", "c", "d"]
    assert "\n\n" not in rows_file.read_text()
    for before, after in ((b"", "{"), (b"x", "x\n{"), (b"\n", "\n{")):  # the smallest files
        rows_file.write_bytes(before)
        with readouts_rows.appending(rows_file) as f:
            f.write(json.dumps(row) + "\n")
        assert rows_file.read_text().startswith(after)


def test_recold_does_not_copy_a_twin_row_that_was_not_timed_cold(tmp_path: Path) -> None:
    """direct asks a choice question as letters does, so its row is letters' row copied; a
    --recold run copies only a cold one, or the warm copy would come back on every run."""
    (tmp_path / "easy.jsonl").write_text(json.dumps(TASKS[1]) + "\n")
    [task] = readouts.load_tasks(tmp_path, ["easy"], None)
    assert task.kind == "choice" and readouts.twin("direct", "choice") == "letters"
    assert readouts.twin("continuation-pmi+contextual", "noul") == "continuation-pmi"
    assert readouts.twin("letters+contextual", "noul") is None  # its correction is a pass
    row = {"config": "letters", "split": task.file, "id": task.id, "predicted": "x"}
    rows = {("letters", "1", task.file, task.id): row}
    assert readouts.copied(rows, task, "direct", "1")["copied_from"] == "letters"
    assert readouts.copied(rows, task, "direct", "1", cold=True) is None
    row["cold"] = True
    assert readouts.copied(rows, task, "direct", "1", cold=True)["config"] == "direct"


def test_a_twin_asked_again_is_copied_anew_through_a_copy_of_a_copy(tmp_path: Path) -> None:
    """The configs that copy a twin's row follow it when it is asked again (--recold, a new
    prompt version), in the same run: no stale copy is left for a later run to find; so does a
    row a config asked itself that is no longer the engine's now, and a copy of a twin's row
    asked again into an error."""
    (tmp_path / "easy.jsonl").write_text(json.dumps(TASKS[1]) + "\n")
    [task] = readouts.load_tasks(tmp_path, ["easy"], None)
    assert readouts.twin("continuation-pmi", "choice") == "continuation-pmi+contextual"
    assert readouts.twin("per-type", "choice") == "continuation-pmi"

    def row(config: str, p: float, cold: bool = True, **more: str) -> dict:
        now = readouts_rows.ENGINE_NUMBERS
        return {"config": config, "id": task.id, "p_expected": p, "cold": cold} | {
            "engine_numbers": now,
            **more,
        }

    asked = row("continuation-pmi+contextual", 0.9)
    rows = {
        ("continuation-pmi+contextual", "1", task.file, task.id): asked,
        ("continuation-pmi", "1", task.file, task.id): row(
            "continuation-pmi", 0.2, copied_from="continuation-pmi+contextual"
        ),
        ("per-type", "1", task.file, task.id): row("per-type", 0.2, copied_from="continuation-pmi"),
        ("per-type", "N", task.file, task.id): row("per-type", 0.1, copied_from="continuation-pmi"),
    }
    fresh = readouts.recopied(rows, [task], [("continuation-pmi+contextual", "1")])
    assert [(r["config"], r["copied_from"], r["p_expected"]) for r in fresh] == [
        ("continuation-pmi", "continuation-pmi+contextual", 0.9),
        ("per-type", "continuation-pmi", 0.9),
    ]
    assert rows[("per-type", "1", task.file, task.id)] == fresh[1]
    assert rows[("per-type", "N", task.file, task.id)]["p_expected"] == 0.1  # another order
    assert readouts.recopied(rows, [task], [("continuation-pmi+contextual", "1")]) == []
    # --recold copies only a row timed cold, as it asks.
    rows[("continuation-pmi+contextual", "1", task.file, task.id)] = row(
        "continuation-pmi+contextual", 0.5, cold=False
    )
    asked_again = [("continuation-pmi+contextual", "1")]
    assert readouts.recopied(rows, [task], asked_again, True) == []
    rows[asked_again[0] + (task.file, task.id)] = row("continuation-pmi+contextual", 0.7)
    fresh = readouts.recopied(rows, [task], asked_again, True)
    assert [(r["config"], r["p_expected"]) for r in fresh] == [
        ("continuation-pmi", 0.7),
        ("per-type", 0.7),
    ]

    # per-type's own rows: in one order asked before ENGINE_NUMBERS 2 (not current), in every
    # order current. Asked again, the twin's row replaces only the first.
    pmi = [("continuation-pmi", "1"), ("continuation-pmi", "N")]
    rows[("continuation-pmi", "N", task.file, task.id)] = row("continuation-pmi", 0.8)
    stale = row("per-type", 0.2, applied="continuation") | {"engine_numbers": 1}
    own = row("per-type", 0.1, applied="continuation")
    assert not readouts_rows.current(stale) and readouts_rows.current(own)
    rows[("per-type", "1", task.file, task.id)] = stale
    rows[("per-type", "N", task.file, task.id)] = own
    assert readouts.recopied(rows, [task], pmi, True) == [
        rows[pmi[0] + (task.file, task.id)]
        | {"config": "per-type", "copied_from": "continuation-pmi"}
    ]
    assert rows[("per-type", "1", task.file, task.id)]["p_expected"] == 0.7
    assert rows[("per-type", "N", task.file, task.id)] == own
    # Nor where the twin's row is not the engine's now either.
    rows[("per-type", "1", task.file, task.id)] = stale
    rows[pmi[0] + (task.file, task.id)] = row("continuation-pmi", 0.6, cold=False)
    assert readouts.recopied(rows, [task], pmi) == []  # not even without --recold
    assert rows[("per-type", "1", task.file, task.id)] == stale
    # letters' own row never becomes a copy of direct's, whose choices are letters' request.
    letters = [("direct", "1")]
    rows[("letters", "1", task.file, task.id)] = row("letters", 0.3, cold=False)
    rows[("direct", "1", task.file, task.id)] = row("direct", 0.4, applied="letters")
    assert readouts.twin("letters", "choice") == "direct"
    assert readouts.recopied(rows, [task], letters, True) == []
    # Asked again into an error (a row as answer_row writes it: cold, the engine's numbers):
    # the copy says so (its config asks it itself next run); an own row keeps its answer, be it
    # the engine's now or not.
    failed = row("continuation-pmi", 0.0) | {"error": "500: boom"}
    del failed["p_expected"]
    rows[pmi[0] + (task.file, task.id)] = failed
    rows[pmi[1] + (task.file, task.id)] = dict(failed)
    rows[("per-type", "1", task.file, task.id)] = row(
        "per-type", 0.7, copied_from="continuation-pmi"
    )
    fresh = readouts.recopied(rows, [task], pmi, True)
    assert fresh == [failed | {"config": "per-type", "copied_from": "continuation-pmi"}]
    assert rows[("per-type", "N", task.file, task.id)] == own
    rows[("per-type", "N", task.file, task.id)] = stale
    assert readouts.recopied(rows, [task], pmi, True) == []


def test_families_choose_tasks_within_each_split(tmp_path: Path) -> None:
    (tmp_path / "easy.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    picked = readouts.load_tasks(tmp_path, ["easy"], None, ["intent", "ordinal"])
    assert [t.id for t in picked] == ["mini-choice-0", "mini-score-0"]
    assert readouts.load_tasks(tmp_path, ["easy"], 1, ["ordinal"])[0].id == "mini-score-0"
    # A family that no task has: nothing to ask, said in one line with exit 2.
    argv = ["--tasks-dir", str(tmp_path), "--splits", "easy", "--families", "none_such"]
    assert readouts.main([*argv, "--results-dir", str(tmp_path)]) == 2


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for argv in (
        ["--configs", "nope"],
        ["--permutations", "0"],
        ["--permutations", " , "],
        ["--tasks-dir", str(tmp_path / "x")],
        ["--families", " , "],
        ["--repack", "maybe"],
    ):
        with pytest.raises(SystemExit) as exc:
            readouts.main(argv)
        assert exc.value.code == 2


def test_rows_of_a_readout_added_since_stay_and_a_changed_version_is_asked_again() -> None:
    from bench.readouts_rows import superseded

    wanted = {
        "format": 1,
        "model": "m.gguf",
        "model_sha256": "a" * 64,
        "prompt_versions": {"letters": "semif-letter-v1", "deliberate": "semif-deliberate-v1"},
    }
    older = {**wanted, "prompt_versions": {"letters": "semif-letter-v1"}}
    assert superseded(older, wanted) == set()  # written before `deliberate` existed
    changed = {**wanted, "prompt_versions": {"letters": "semif-letter-v0"}}
    assert superseded(changed, wanted) == {"semif-letter-v0"}
    assert superseded({**older, "model_sha256": "b" * 64}, wanted) is None
    assert superseded({**older, "format": 2}, wanted) is None


def test_every_task_is_timed_from_a_cold_state(decision_engine) -> None:
    """A config asked after another on the same task finds nothing of its state held (no
    prefix kept, no prefix cache entry): its time is its own, state prefill included. Before,
    a later config could restore the earlier one's prefix and look several times cheaper."""
    from semif_proxy.eval.jevbench import Task

    task = Task("easy", TASKS[0])
    first = readouts.answer_row(decision_engine, task, "letters", "1")
    again = readouts.answer_row(decision_engine, task, "letters+contextual", "1")
    for row in (first, again):
        assert "error" not in row, row
        assert row["cold"] is True and row["engine_timing"]["prefix_reused_tokens"] == 0
    assert again["engine_timing"]["prefill_seconds"] > 0
    assert len(decision_engine.cache) <= 2  # only the last task's: its state, the content-free one


def test_a_config_by_type_asks_each_type_as_the_config_it_names(tmp_path: Path) -> None:
    """`per-type` is no readout of its own: each question type is asked with exactly the
    fields of the config it names there, so that config's row is its row (copied)."""
    (tmp_path / "easy.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    tasks = readouts.load_tasks(tmp_path, ["easy"], None)
    for task in tasks:
        named = readouts.PER_TYPE["per-type"][task.kind]
        assert readouts.body_for(task, "per-type", "1") == readouts.body_for(task, named, "1")
        assert readouts.twin("per-type", task.kind) == named
        row = {"config": named, "split": task.file, "id": task.id, "cold": True}
        copy = readouts.copied({(named, "1", task.file, task.id): row}, task, "per-type", "1")
        assert copy == row | {"config": "per-type", "copied_from": named}
    assert readouts.parse_args(["--configs", "per-type", "--summary"]).configs == ["per-type"]


def _rows(config: str, right: dict[tuple[str, str], set[int]], seconds: float = 1.0) -> dict:
    """231 rows of one run: task i is of type ("choice", "noul", "score")[i % 3], the first
    120 in easy/original, the rest hard; right where its (split part, type) set holds i."""
    out = {}
    for i in range(231):
        kind = ("choice", "noul", "score")[i % 3]
        split = ("easy", "original")[i % 2] if i < 120 else "hard"
        part = "dev" if i < 120 else "hard"
        out[(split, f"t{i}")] = {
            "config": config, "permutations": "1", "split": split, "id": f"t{i}", "type": kind,
            "correct": i in right.get((part, kind), set()), "seconds": seconds,
        }  # fmt: skip
    return out


def test_the_config_by_type_is_checked_against_the_tasks_that_did_not_choose_it() -> None:
    from bench.readouts_failures import chosen_per_type, held_out

    everything = set(range(231))
    pmi = _rows("continuation-pmi", {("dev", "choice"): everything, ("hard", "choice"): {120}})
    lc = _rows(
        "letters+contextual",
        {("dev", "noul"): everything, ("dev", "score"): everything, ("hard", "noul"): {121, 124}},
    )
    # As many right on dev as pmi on choices, slower: the tie goes to the faster one.
    slow = _rows("deliberate", {("dev", "choice"): everything}, seconds=9.0)
    mix = {
        k: (pmi if r["type"] == "choice" else lc)[k] | {"config": "per-type"}
        for k, r in pmi.items()
    }
    runs = {"continuation-pmi@1": pmi, "letters+contextual@1": lc, "deliberate@1": slow}
    chosen = chosen_per_type(runs)
    assert chosen == {
        "choice": ("continuation-pmi@1", 40, 40),
        "noul": ("letters+contextual@1", 40, 40),
        "score": ("letters+contextual@1", 40, 40),
    }
    [text, _] = held_out({**runs, "per-type@1": mix}, "per-type@1")
    assert "(the same)." in text
    # Hard: pmi gets task 120 (a choice), letters+contextual 121 and 124 (yes/no): the mix all 3.
    assert "On the 111 tasks that did not choose it (hard) it gets 3;" in text
    # On easy+original, letters+contextual gets 80 (yes/no and scores), pmi 40: the single run
    # they choose; on hard the mix gets one task more (120): +1/111 = +0.9 pt.
    assert "against `letters+contextual@1` (2), the single one-order run" in text
    assert ": +0.9 pt [+0.0, +2.7] (n=111)" in text
    assert "an upper bound), is `letters+contextual@1` with 2." in text
    # Rows that would choose another config now are said to.
    runs["deliberate@1"] = _rows("deliberate", {("dev", "choice"): everything}, seconds=0.5)
    [text, _] = held_out({**runs, "per-type@1": mix}, "per-type@1")
    assert "no longer the same" in text and "choice `deliberate@1` (40/40)" in text
    assert held_out(runs, "letters+contextual@1") == []  # a run of one config: nothing to say


def test_remaining_counts_what_a_run_would_ask_and_times_it_by_its_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_path: Path
) -> None:
    from bench.readouts_plan import remaining
    from bench.readouts_rows import fingerprint, read_rows

    tasks_dir, out = tmp_path / "tasks", tmp_path / "results"
    tasks_dir.mkdir()
    out.mkdir()
    hard = [dict(t, id=t["id"].replace("mini", "hard")) for t in TASKS]
    (tasks_dir / "easy.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (tasks_dir / "hard.jsonl").write_text("".join(json.dumps(t) + "\n" for t in hard))
    header = fingerprint(Path("m.gguf"), "0" * 64)
    old = {**header, "prompt_versions": {**header["prompt_versions"], "continuation": "old"}}

    def row(config: str, split: str, task: dict, seconds: float, **extra: object) -> str:
        body = {"config": config, "permutations": "1", "split": split, "id": task["id"]}
        return json.dumps({**body, "seconds": seconds, **extra}) + "\n"

    lines = [json.dumps({"fingerprint": old}) + "\n"]
    lines += [row("letters", "easy", t, s) for t, s in zip(TASKS, (1.0, 2.0, 3.0))]
    lines += [row("letters", "hard", t, s) for t, s in zip(hard, (4.0, 6.0, 8.0))]
    # continuation-sum: two easy tasks answered (at twice letters' seconds), the third's row
    # is of the replaced version "old" (asked again), no hard row yet.
    lines += [row("continuation-sum", "easy", t, s) for t, s in zip(TASKS[:2], (2.0, 4.0))]
    lines.append(row("continuation-sum", "easy", TASKS[2], 9.0, prompt_version="old"))
    lines.append(row("deliberate", "easy", TASKS[0], 5.0, error="engine busy"))
    rows_file = out / "readouts-mini.jsonl"
    rows_file.write_text("".join(lines))

    argv = ["--tag", "mini", "--tasks-dir", str(tasks_dir), "--results-dir", str(out)]
    argv += ["--splits", "easy,hard"]  # no --model: the rows file's own is judged by
    configs = "letters,continuation-sum,direct,deliberate"
    assert readouts.main([*argv, "--remaining", "--configs", configs, "--permutations", "1,N"]) == 0
    table = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert table["letters@1"] == ["6/6", "0", "0", "-"]
    # direct asks a choice question as letters does: the two choice tasks are copies.
    assert table["direct@1"] == ["0/6", "2", "4", "?"]
    assert table["deliberate@1"] == ["0/6", "0", "6", "?"]  # an error row is asked again
    assert table["letters@N"] == ["0/6", "0", "6", "?"]
    assert table["continuation-sum@1"][:3] == ["2/6", "0", "4"]

    # By hand: one easy task left at its own easy mean (3 s), three hard ones at letters' hard
    # mean (6 s) times its cost against letters on the tasks both answered ((2+4)/(1+2) = 2).
    _, held = read_rows(rows_file)
    held = {k: r for k, r in held.items() if r.get("prompt_version") != "old"}
    tasks = readouts.load_tasks(tasks_dir, ["easy", "hard"], None)
    [entry] = remaining(held, tasks, [("continuation-sum", "1")], readouts.copied)
    assert (entry["asked"], entry["left"]) == (2, 4)
    assert entry["minutes"] == pytest.approx((1 * 3.0 + 3 * 6.0 * 2.0) / 60)
    # --recold: a letters row not timed cold is asked again (the others carry no `cold`
    # either: all six).
    assert readouts.main([*argv, "--remaining", "--configs", "letters", "--recold"]) == 0
    recold = {x.split()[0]: x.split()[1:] for x in capsys.readouterr().out.splitlines()}
    assert recold["letters@1"] == ["0/6", "0", "6", "<1"]  # 3 x 2 s + 3 x 6 s: 0.4 minutes
    # No rows file: every config asked in order, a twin copying what an earlier one of the
    # order writes (11 configs x 6 tasks; copies: direct and direct+contextual 2 choices each,
    # pmi+contextual 6, per-type 6).
    assert readouts.main([*argv, "--remaining", "--tag", "none", "--permutations", "1"]) == 0
    assert "left: 50 tasks" in capsys.readouterr().out
    # Rows of another format, or not of the --model given: refused as a run refuses them.
    assert readouts.main([*argv, "--remaining", "--model", str(model_path)]) == 2
    rows_file.write_text(json.dumps({"fingerprint": {**old, "format": 0}}) + "\n")
    assert readouts.main([*argv, "--remaining"]) == 2
    # Usage errors exit 2: a bad count, a --model that is not there.
    for bad in (["--permutations", "0"], ["--model", str(tmp_path / "absent.gguf")]):
        with pytest.raises(SystemExit) as exc:
            readouts.main([*argv, "--remaining", *bad])
        assert exc.value.code == 2


TYPE_KINDS = ("choice", "noul", "score")


def _summary_rows(config: str, right: set[int]) -> list[dict]:
    extra = {"p_predicted": 0.5, "input_tokens": 100, "load1": 1.0, "applied": "x", "cold": True}
    rows = _rows(config, {(p, k): right for p in ("dev", "hard") for k in TYPE_KINDS})
    return [r | extra for r in rows.values()]


def test_the_normalization_is_chosen_by_paired_differences_over_every_task() -> None:
    from bench.readouts_docs import chosen_normalization, normalization_verdict
    from bench.readouts_summary import summarise

    every = set(range(231))
    even = {i for i in every if i % 2 == 0}  # 116 tasks
    rows = [
        *_summary_rows("letters", even),
        *_summary_rows("continuation-sum", even),
        *_summary_rows("continuation-mean", even),
        *_summary_rows("continuation-pmi", every),
    ]
    runs = summarise(rows, None, "qwen2.5-1.5b")["runs"]
    vs = runs["continuation-pmi@1"]["vs_normalizations"]
    assert sorted(vs) == ["continuation-mean@1", "continuation-sum@1"]
    assert vs["continuation-sum@1"]["all"]["pairs"] == 231
    assert vs["continuation-sum@1"]["all"]["difference"] == pytest.approx(115 / 231)
    # Choices are tasks 0, 3, 6, ... (77); sum gets those that are even too (0, 6, ...: 39).
    assert vs["continuation-sum@1"]["choice"]["pairs"] == 77
    assert vs["continuation-sum@1"]["choice"]["difference"] == pytest.approx((77 - 39) / 77)
    assert runs["continuation-sum@1"]["vs_normalizations"]["continuation-pmi@1"]["all"][
        "difference"
    ] == pytest.approx(-115 / 231)
    assert "vs_normalizations" not in runs["letters@1"]
    assert chosen_normalization(runs) == "pmi"
    text = "\n".join(normalization_verdict(runs))
    assert "- continuation-pmi@1 against continuation-sum@1: +49.8 pt" in text
    assert "Chosen: `pmi`" in text

    # Two tasks apart from mean: the interval reaches zero, so nothing is chosen.
    rows = [r for r in rows if r["config"] != "continuation-mean"]
    rows += _summary_rows("continuation-mean", every - {1, 3})
    runs = summarise(rows, None, "qwen2.5-1.5b")["runs"]
    lo = runs["continuation-pmi@1"]["vs_normalizations"]["continuation-mean@1"]["all"]
    assert lo["bootstrap95"][0] <= 0
    assert chosen_normalization(runs) is None
    assert "None does yet" in "\n".join(normalization_verdict(runs))
    # A run that has not answered every task chooses nothing either.
    rows = [r for r in rows if r["config"] != "continuation-mean"]
    rows += [r for r in _summary_rows("continuation-mean", even) if r["id"] != "t5"]
    assert chosen_normalization(summarise(rows, None, "qwen2.5-1.5b")["runs"]) is None


def test_the_server_reads_a_continuation_as_the_evidence_chose() -> None:
    """The committed evidence and the server's default normalization agree (or the evidence
    chooses none yet, and the default stays)."""
    from bench.readouts_docs import chosen_normalization
    from semif_proxy.settings.defaults import DEFAULT_NORMALIZATION

    summary = json.loads((ROOT / "bench" / "results" / "readouts-qwen2.5-1.5b.json").read_text())
    assert chosen_normalization(summary["runs"]) in (None, DEFAULT_NORMALIZATION)


def test_the_server_reads_and_corrects_by_default_as_the_evidence_chose() -> None:
    """settings/defaults.py's readout and corrections are what the rule reads in the committed
    evidence: a correction by type only where letters with it meet the rule for that type; one
    for every type only where it meets the rule for each type alone; and letters stay the
    readout while no other readout meets it."""
    from bench.readouts_docs import judged
    from semif_proxy.settings import defaults

    summary = json.loads((ROOT / "bench" / "results" / "readouts-qwen2.5-1.5b.json").read_text())
    met = {(config, kind) for _, config, kind, _, why in judged(summary["runs"]) if not why}
    by_type = {(config, kind) for config, kind in met if kind != "all"}
    assert by_type == {
        (f"{defaults.DEFAULT_READOUT}+{correction}", kind)
        for kind, correction in defaults.DEFAULT_BIAS_CORRECTION_BY_TYPE.items()
    }
    kinds = set(summary["runs"]["letters@1"]["by"]["all"]) - {"all"}
    assert kinds == {"noul", "choice", "score"}
    everywhere = {c for c, _ in by_type if all((c, k) in met for k in kinds)}
    if everywhere:
        assert f"{defaults.DEFAULT_READOUT}+{defaults.DEFAULT_BIAS_CORRECTION}" in everywhere
    else:
        assert defaults.DEFAULT_BIAS_CORRECTION == "none"
    assert defaults.DEFAULT_READOUT == "letters"
    assert all(config.startswith("letters+") for config, _ in met), met


def test_rows_that_went_after_a_held_prefix_before_the_ubatch_cut_carry_older_numbers() -> None:
    """Rows answered before ENGINE_NUMBERS 2 keep their numbers only where their evaluation
    was one-piece (one order, no branch after a held prefix); --recold asks the others."""
    from bench.readouts_rows import ENGINE_NUMBERS, current, numbers_current

    one = {"config": "letters", "permutations": "1", "split": "s", "id": "t", "cold": True}
    assert numbers_current(one) and current(one)
    assert numbers_current({**one, "config": "direct+contextual"})
    assert numbers_current({**one, "config": "per-type", "applied": "letters+contextual"})
    assert numbers_current({**one, "config": "deliberate"})  # read in one piece then
    assert not current({**one, "config": "deliberate"})  # but timed before the shared prefix
    for older in (
        {**one, "config": "continuation-pmi"},  # each option a branch after the prefix
        {**one, "permutations": "N"},  # every order after the first
        {**one, "config": "deliberate", "engine_cost": 2},  # the read after the held prefix
        {**one, "config": "per-type", "copied_from": "continuation-sum"},
        {**one, "config": "per-type", "applied": "continuation"},  # asked itself
    ):
        assert not numbers_current(older) and not current(older)
        assert numbers_current({**older, "engine_numbers": ENGINE_NUMBERS})
    assert current({**one, "config": "deliberate", "engine_cost": 2, "engine_numbers": 2})

"""`python -m bench.readouts`: every JevBench task under each readout of issue #35, in-process
on the real engine (the services the routes run, no HTTP), with and without permutations.

    python -m bench.readouts --model M.gguf --tag TAG [--configs ...] [--permutations 1,N]
    python -m bench.readouts --summary --tag TAG   # bench/results/readouts-TAG.json again
    python -m bench.readouts --docs [--out ROOT]   # docs/readouts.md and its plot
    python -m bench.readouts --remaining --tag TAG # what a run would still ask, and how long

Each answered task is one line of bench/results/readouts-TAG.jsonl (config, permutations, task
id: predicted, expected, correct, the probabilities of both, seconds, input tokens, type, split,
family), written as it is answered: a rerun skips the lines there (a run can stop at any point,
or after --max-minutes, and go on later). The file's first line is the fingerprint (model
sha256, prompt versions); rows of another model or prompt are refused unless --fresh.

`direct` reads the model's own yes/no or level-number words and applies to noul and score
questions only: choice questions are asked with letters under it (their rows say
`applied: letters`; that request is the letters config's, whose row is reused where there is
one, `copied_from`; a twin's row asked again is copied anew to the configs that copy it as the
run ends, killed by SIGTERM or not; after a SIGKILL, on the twin's next run).
Permutations `N` is each task's option count (every cyclic order).
Default server settings (`load_settings`: no SEMIF_* of the environment) but for
SEMIF_BIAS_CORRECTION=none, so that each config is what it names; prefix cache on, as
served. The summary (per config, split and question type: accuracy with a Wilson 95 %
interval, the paired difference against letters with a bootstrap 95 % interval, ECE,
latency, cost against letters) is bench/readouts_summary.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from bench.readouts_rows import (
    ENGINE_NUMBERS,
    appending,
    current,
    engine_cost,
    fingerprint,
    read_rows,
    rewrite,
    row_key,
    superseded,
)
from semif_proxy.engine.bias import is_pmi
from semif_proxy.eval.jevbench import Task, label_probabilities, predicted_label, read_tasks
from semif_proxy.settings.schema import Settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TASKS_DIR = ROOT.parent / "shared" / "jevbench"
MODEL = Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-proxy"))
MODEL = MODEL / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SPLITS = ("easy", "original", "hard")
# The question fields of each configuration (none: the defaults, i.e. letters).
CONFIGS: dict[str, dict[str, str]] = {
    "letters": {},
    "continuation-sum": {"readout": "continuation", "normalization": "sum"},
    "continuation-mean": {"readout": "continuation", "normalization": "mean"},
    "continuation-pmi": {"readout": "continuation", "normalization": "pmi"},
    "direct": {"readout": "direct"},
    "letters+contextual": {"bias_correction": "contextual"},
    "continuation-pmi+contextual": {
        "readout": "continuation",
        "normalization": "pmi",
        "bias_correction": "contextual",
    },
    "direct+contextual": {"readout": "direct", "bias_correction": "contextual"},
    # The model writes up to 64 tokens first (the default budget), then its letter is read.
    "deliberate": {"readout": "deliberate"},
    # Divided by the letters after its own reasoning on the content-free state (same budget).
    "deliberate+contextual": {"readout": "deliberate", "bias_correction": "contextual"},
}
# Configurations by question type: each type asked exactly as the named config asks it (so its
# rows are that config's, `copied_from`, where they are there). `per-type` was chosen on the
# easy and original splits alone, on qwen2.5-1.5b: per type, the one-order run with the most
# right answers there (readouts_failures.chosen_per_type says so from the rows), so the hard
# split, which did not choose it, tells how it does on questions it was not fitted to. As a
# server's defaults: SEMIF_READOUT={"choice": "continuation"}, SEMIF_NORMALIZATION=pmi,
# SEMIF_BIAS_CORRECTION={"noul": "contextual", "score": "contextual"} (docs/configuration.md).
PER_TYPE: dict[str, dict[str, str]] = {
    "per-type": {
        "choice": "continuation-pmi",
        "noul": "letters+contextual",
        "score": "letters+contextual",
    },
}
NAMES = (*CONFIGS, *PER_TYPE)
DIRECT_TYPES = ("noul", "score")
# What each row keeps of the answer's `semif.timing` (where the seconds went).
ENGINE_TIMING = ("prefill_seconds", "suffix_seconds", "suffix_tokens", "prefix_reused_tokens")
# What deliberate adds (absent for the other readouts): tokens written and their seconds.
DELIBERATE_TIMING = ("generated_tokens", "generation_seconds")


def fields_for(config: str, kind: str) -> tuple[dict[str, str], str]:
    """The question fields a config adds for a question type, and the readout applied."""
    if config in PER_TYPE:
        return fields_for(PER_TYPE[config][kind], kind)
    fields = dict(CONFIGS[config])
    if fields.get("readout") == "direct" and kind not in DIRECT_TYPES:
        fields.pop("readout")  # direct reads yes/no or levels only: choice keeps letters
    return fields, fields.get("readout", "letters")


def option_count(task: Task) -> int:
    criteria = task.row["question"].get("criteria")
    return 2 if task.kind == "noul" else len(criteria or ())


def asked_permutations(spec: str, task: Task) -> int:
    return option_count(task) if spec == "N" else int(spec)


def body_for(task: Task, config: str, spec: str) -> dict[str, Any]:
    fields, _ = fields_for(config, task.kind)
    body = task.request()
    body["questions"]["q"] = {**task.row["question"], **fields}
    body["permutations"] = asked_permutations(spec, task)
    return body


def load_tasks(
    directory: Path, splits: list[str], limit: int | None, families: list[str] | None = None
) -> list[Task]:
    out = []
    for split in splits:
        path = directory / f"{split}.jsonl"
        chosen = list(read_tasks([path])) if path.exists() else []
        if families:
            chosen = [t for t in chosen if t.row.get("family") in families]
        out += chosen[:limit] if limit else chosen
    return out


def computed_as(config: str, kind: str) -> dict[str, str]:
    """The fields that decide what the engine computes for a question of this type (a
    contextual correction on top of pmi is none: engine/bias.py)."""
    fields = fields_for(config, kind)[0]
    if is_pmi(fields.get("readout"), fields.get("normalization")):
        fields.pop("bias_correction", None)
    return fields


def twin(config: str, kind: str) -> str | None:
    """The first other config whose answer to a question of this type is computed exactly as
    `config`'s (direct on a choice question: letters; pmi+contextual: pmi)."""
    fields = computed_as(config, kind)
    return next((c for c in CONFIGS if c != config and computed_as(c, kind) == fields), None)


def copied(
    rows: dict[tuple, dict], task: Task, config: str, spec: str, cold: bool = False
) -> dict | None:
    """The twin config's row of this task, as this config's (the same request: asking it
    again would give the same numbers), or None where there is none yet; with `cold`, none
    whose numbers or seconds are not the engine's now either (readouts_rows.current: --recold
    asks it itself)."""
    other, row = twin_row(rows, task, config, spec)
    if row is None or "error" in row or (cold and not current(row)):
        return None
    return as_copy(row, config, other)


def twin_row(
    rows: dict[tuple, dict], task: Task, config: str, spec: str
) -> tuple[str | None, dict | None]:
    """`config`'s twin for this task's type and the twin's row of this task (None: none)."""
    other = twin(config, task.kind)
    return other, rows.get((other, spec, task.file, task.id)) if other else None


def as_copy(row: dict, config: str, other: str) -> dict:
    """The twin `other`'s row as `config`'s."""
    return row | {"config": config, "copied_from": other}


def recopied(
    rows: dict[tuple, dict], tasks: list[Task], runs: list[tuple[str, str]], cold: bool = False
) -> list[dict]:
    """The rows of the configs whose twin is one of the runs, copied anew where they no longer
    follow the twin's row (no engine work): a copy (`copied_from`) would otherwise keep the
    twin's old numbers after the twin is asked again (--recold, a prompt's new version), and a
    row its config asked itself, no longer the engine's now (readouts_rows.current), would wait
    for that config's own --recold while the twin's row is current. Such a row stays where it
    is current, where the twin's row is an error or not current, and where the twin comes
    later in NAMES (letters' own rows never become copies of direct's). A twin's row asked
    again into an error is copied as that error (its config asks it itself on its next run).
    Followed through a copy of a copy; `rows` is updated; with `cold`, as `copied`."""
    changed, fresh = set(runs), []
    while True:
        added = set()
        for name in NAMES:
            for spec in sorted({s for _, s in changed}):
                for task in tasks:
                    key = (name, spec, task.file, task.id)
                    row, (other, source) = rows.get(key), twin_row(rows, task, name, spec)
                    if row is None or source is None or (other, spec) not in changed:
                        continue
                    if row.get("copied_from") != other and (
                        current(row)
                        or "error" in source
                        or not current(source)
                        or NAMES.index(other) > NAMES.index(name)
                    ):
                        continue  # its own answer stays: see above
                    if cold and "error" not in source and not current(source):
                        continue  # as `copied`; an error is copied on whatever its numbers
                    copy = as_copy(source, name, other)
                    if copy != row:
                        rows[key] = copy
                        fresh.append(copy)
                        added.add((name, spec))
        if not added:
            return fresh
        changed |= added


def append_copies(
    rows_file: Path, rows: dict[tuple, dict], tasks: list[Task], runs: list, cold: bool
) -> None:
    """`recopied`'s rows, appended to the rows file."""
    from semif_proxy.progress import note

    again = recopied(rows, tasks, runs, cold)
    if not again:
        return
    with appending(rows_file) as f:
        f.writelines(json.dumps(row) + "\n" for row in again)
    note(f"{len(again)} rows copied anew from their twin's row (copied_from)")


def cold_start(engine: Any) -> None:
    """Every task asked as a request on new evidence: nothing of its state held (no prefix
    cache entry, no prefix kept in the engine), so its time includes the state's prefill
    whichever config asked that state before. Content-free answers stay cached, as a server
    keeps them (they are per option set: JevBench's tasks rarely share one)."""

    def drop() -> None:
        engine.cache.clear()
        engine.core.reset()

    engine.thread.call(drop)


def answer_row(engine: Any, task: Task, config: str, spec: str) -> dict[str, Any]:
    """One task under one config: asked through the System One service, timed."""
    from semif_proxy.api import services
    from semif_proxy.errors import ApiError

    _, applied = fields_for(config, task.kind)
    row: dict[str, Any] = {
        "config": config,
        "permutations": spec,
        "permutations_asked": asked_permutations(spec, task),
        "split": task.file,
        "id": task.id,
        "type": task.kind,
        "family": task.row.get("family"),
        "applied": applied,
        "expected": task.expected,
        "cold": True,  # cold_start: comparable times across configs
        "engine_cost": engine_cost(config),
        "engine_numbers": ENGINE_NUMBERS,
    }
    service = services.SERVICES["systemone"]
    cold_start(engine)
    load1 = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    try:
        planned = service.plan(body_for(task, config, spec), engine.settings, engine.sha256)
        answered = service.answer(engine, planned)
    except ApiError as exc:
        return row | {"error": f"{exc.status}: {str(exc)[:300]}", "load1": load1}
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    answer = answered.body["answers"]["q"]
    timing = answered.body.get("semif", {}).get("timing", {})
    probs = label_probabilities(answer)
    predicted = predicted_label(answer)
    return row | {
        "predicted": predicted,
        "correct": predicted == task.expected,
        "p_predicted": probs[predicted],
        "p_expected": probs.get(task.expected, 0.0),
        "probabilities": probs,
        "readout": answer.get("readout"),
        "prompt_version": answer.get("prompt_version"),
        "seconds": seconds,
        # CPU seconds of this process (every engine thread): less moved by other work than
        # `seconds` on a shared machine, though threads that spin while others wait add some.
        "cpu_seconds": cpu,
        # Every engine part (None where not reported); deliberate's only where it wrote.
        "engine_timing": {k: timing.get(k) for k in ENGINE_TIMING}
        | {k: timing[k] for k in DELIBERATE_TIMING if k in timing},
        "input_tokens": answered.input_tokens,
        "load1": load1,
        # The weights' layout SEMIF_REPACK=auto chose for this engine (timed at its start, per
        # build: it has differed between builds here), whose kernels sum in another order.
        "repacked": bool(engine.model_info.get("repack", {}).get("on")),
    }


def refused(engine: Any, chosen: list[Task], runs: list[tuple[str, str]]) -> list[str]:
    """Configs the API does not take (planned on one task of each type, nothing asked)."""
    from semif_proxy.api import services
    from semif_proxy.errors import ApiError

    problems = []
    for config, spec in runs:
        for kind in sorted({t.kind for t in chosen}):
            task = next(t for t in chosen if t.kind == kind)
            try:
                body = body_for(task, config, spec)
                services.SERVICES["systemone"].plan(body, engine.settings, engine.sha256)
            except ApiError as exc:
                problems.append(f"{config} (permutations {spec}, {kind}): {str(exc)[:200]}")
    return problems


def load_engine(model: Path, repack: str = "auto") -> Any:
    from semif_proxy.engine.worker import DecisionEngine
    from semif_proxy.settings import load_settings

    # Every config names its own correction: none where it names none (the server's own
    # default corrects yes/no questions, which would make `letters` letters+contextual there).
    # The layout pinned (on/off) where a run's rows must match earlier ones bit for bit: auto's
    # choice can flip between builds or under load, and the numbers differ between layouts.
    env = {"SEMIF_BIAS_CORRECTION": "none", "SEMIF_REPACK": repack}
    return DecisionEngine.load(load_settings(env=env, model=str(model), chat=False))


def chosen_tasks(args: argparse.Namespace) -> list[Task]:
    """The tasks the arguments name; none said in one line on stderr."""
    chosen = load_tasks(args.tasks_dir, args.splits, args.limit, args.families)
    if not chosen:
        print(
            f"no tasks for splits {args.splits} (families {args.families or 'all'}) in "
            f"{args.tasks_dir}",
            file=sys.stderr,
        )
    return chosen


def another_run(rows_file: Path, header: dict, wanted: dict) -> int:
    print(
        f"{rows_file} holds rows of another run (fingerprint {json.dumps(header)}; this one "
        f"{json.dumps(wanted)}): use another --tag, or --fresh to discard them",
        file=sys.stderr,
    )
    return 2


def run(args: argparse.Namespace, out: Path) -> int:
    from semif_proxy.model.files import model_sha256
    from semif_proxy.progress import bar, note

    chosen = chosen_tasks(args)
    if not chosen:
        return 2
    rows_file = out / f"readouts-{args.tag}.jsonl"
    header, rows = read_rows(rows_file)
    wanted = fingerprint(args.model, model_sha256(args.model))
    gone = superseded(header, wanted) if header is not None and header != wanted else None
    if gone is not None:
        # A readout added since: its version joins the header, the rows stay. A readout whose
        # version changed: its rows go (git holds them) and are asked again.
        kept = {k: r for k, r in rows.items() if r.get("prompt_version") not in gone}
        if len(kept) < len(rows):
            note(
                f"{len(rows) - len(kept)} rows of {', '.join(sorted(gone))} dropped from "
                f"{rows_file}: that version was replaced; asked again"
            )
        rewrite(rows_file, wanted, kept)
        header, rows = wanted, kept
    if header is not None and header != wanted and not args.fresh:
        return another_run(rows_file, header, wanted)
    if args.fresh or header is None:
        out.mkdir(parents=True, exist_ok=True)
        rows_file.write_text(json.dumps({"fingerprint": wanted}) + "\n", encoding="utf-8")
        rows = {}
    runs = [(c, p) for c in args.configs for p in args.permutations]
    todo = {
        run: [
            t
            for t in chosen
            if (*run, t.file, t.id) not in rows
            or "error" in rows[(*run, t.file, t.id)]
            or (args.recold and not current(rows[(*run, t.file, t.id)]))
        ]
        for run in runs
    }
    if not any(todo.values()):
        note(f"nothing to ask: every row is in {rows_file}")
        ending(rows_file, out, args, chosen, runs, completed=True)
        return 0
    note(f"loading {args.model.name} (load average {os.getloadavg()[0]:.1f})")
    engine = load_engine(args.model, args.repack)
    deadline = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    stopped = False
    previous = signal.getsignal(signal.SIGTERM)
    completed = False  # the loop ended without an exception (a --max-minutes stop too)
    try:
        # Inside `try`: a kill (SIGTERM) from here on ends the run through `finally`.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        problems = refused(engine, chosen, [r for r in runs if todo[r]])
        if problems:
            print(
                "the System One API refuses (has issue #35's readout landed?):\n  "
                + "\n  ".join(problems),
                file=sys.stderr,
            )
            return 2
        answer_row(engine, chosen[0], "letters", "1")  # warm-up, not recorded
        with appending(rows_file) as f:
            for config, spec in runs:
                left = todo[(config, spec)]
                started = time.monotonic()
                with bar(total=len(chosen), desc=f"{config} p={spec}") as shown:
                    shown.update(len(chosen) - len(left))
                    for task in left:
                        if deadline is not None and time.monotonic() > deadline:
                            stopped = True
                            break
                        row = copied(rows, task, config, spec, args.recold) or answer_row(
                            engine, task, config, spec
                        )
                        rows[row_key(row)] = row
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        shown.update(1)
                note(f"{config} permutations {spec}: {time.monotonic() - started:.0f} s")
                if stopped:
                    break
        completed = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        ending(rows_file, out, args, chosen, runs, completed, engine.close)
    if stopped:
        note(f"stopped after --max-minutes {args.max_minutes:g}: run it again to go on")
    return 0


def ending(
    rows_file: Path,
    out: Path,
    args: argparse.Namespace,
    chosen: list[Task],
    runs: list[tuple[str, str]],
    completed: bool,
    close: Callable[[], None] | None = None,
) -> None:
    """A run's last steps: closing the engine (where one was loaded), copying rows on to the
    configs whose twin was asked, and the summary. Each step runs whatever the one before did
    (an interrupt excepted): a run killed (SIGTERM) or failed after asking rows again still
    copies them on (a SIGKILL's: the twin's next run does) and writes its summary. A step's
    error is raised after the others only where the run `completed` (not over the run's own
    error, SIGTERM's exit or a refusal's exit 2)."""
    from bench.readouts_summary import write_summary
    from semif_proxy.progress import note

    def copy_on() -> None:  # from the file: a row is copied on only once it is there
        append_copies(rows_file, read_rows(rows_file)[1], chosen, runs, args.recold)

    def summarize() -> None:
        note(f"wrote {write_summary(rows_file, out / f'readouts-{args.tag}.json', args.tag)}")

    steps = [("closing", close)] if close is not None else []
    failed = None
    for what, step in [*steps, ("copying", copy_on), ("summary", summarize)]:
        try:
            step()
        except Exception as exc:
            note(f"{what} failed: {exc!r}")
            if failed is None:
                failed = exc
    if failed is not None and completed:
        raise failed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.readouts",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", type=Path, default=MODEL, help="the GGUF to ask")
    parser.add_argument("--tag", help="results name (None: the model file's stem, lower case)")
    parser.add_argument(
        "--configs", default=",".join(NAMES), help=f"comma-separated, of: {', '.join(NAMES)}"
    )
    parser.add_argument(
        "--permutations", default="1,N", help="comma-separated counts; N: each task's options"
    )
    parser.add_argument("--splits", default=",".join(SPLITS), help="JevBench files to ask")
    parser.add_argument("--limit", type=int, help="the first N tasks of each split")
    parser.add_argument(
        "--families",
        help="comma-separated task families to ask (e.g. temporal_numeric,trap); None: all",
    )
    parser.add_argument("--tasks-dir", type=Path, default=TASKS_DIR, help="JevBench's files")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="rows and summary")
    parser.add_argument("--max-minutes", type=float, help="stop starting tasks after this long")
    parser.add_argument("--fresh", action="store_true", help="discard the rows already there")
    parser.add_argument(
        "--repack",
        choices=get_args(Settings.model_fields["repack"].annotation),  # SEMIF_REPACK's values
        default=Settings.model_fields["repack"].default,
        help="the weights' layout (SEMIF_REPACK): pin on or off to add rows that match earlier "
        "ones (each row records the layout it was asked in)",
    )
    parser.add_argument(
        "--recold",
        action="store_true",
        help="ask again the rows whose seconds do not count in cost (not timed from a cold "
        "state, or before the engine's work for their readout changed) or whose numbers "
        "predate the engine's (bench/readouts_rows.py ENGINE_COSTS, ENGINE_NUMBERS); the new "
        "row follows the old one and wins",
    )
    parser.add_argument("--summary", action="store_true", help="only rewrite the summary")
    parser.add_argument("--docs", action="store_true", help="only write docs/readouts.md")
    parser.add_argument(
        "--remaining",
        action="store_true",
        help="only say what this run would still ask (per config and permutations: tasks "
        "answered, answered by a twin config's rows, left, and minutes at the seconds its "
        "rows took per split); loads no model",
    )
    parser.add_argument("--out", type=Path, help="with --docs: root to write under")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.model_given = any(a == "--model" or a.startswith("--model=") for a in given)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in NAMES]
    if unknown or not args.configs:
        parser.error(f"--configs: unknown {unknown}; known: {', '.join(NAMES)}")
    args.permutations = [p.strip().upper() for p in args.permutations.split(",") if p.strip()]
    if not args.permutations:
        parser.error("--permutations: none given")
    for p in args.permutations:
        if p != "N" and not (p.isdigit() and 1 <= int(p) <= 255):
            parser.error(f"--permutations: {p!r} is neither 1..255 nor N")
    args.splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not args.splits:
        parser.error("--splits: none given")
    if args.families is not None:
        args.families = [f.strip() for f in args.families.split(",") if f.strip()]
        if not args.families:
            parser.error("--families: none given")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.max_minutes is not None and args.max_minutes <= 0:
        parser.error("--max-minutes must be positive")
    args.tag = args.tag or args.model.stem.lower()
    if not args.docs and not args.summary:
        if (args.model_given or not args.remaining) and not args.model.is_file():
            parser.error(f"--model: no such file {args.model} (make model)")
        if not args.tasks_dir.is_dir():
            parser.error(
                f"--tasks-dir: no JevBench task files at {args.tasks_dir} (they live beside "
                "the checkout in ../shared/jevbench; point --tasks-dir at a copy)"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.docs:
        from bench.readouts_docs import write_docs

        for path in write_docs(args.out or ROOT, args.results_dir):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.summary:
        from bench.readouts_summary import write_summary

        rows_file = args.results_dir / f"readouts-{args.tag}.jsonl"
        if not rows_file.exists():
            print(f"no rows at {rows_file}: run the benchmark first", file=sys.stderr)
            return 2
        print(write_summary(rows_file, args.results_dir / f"readouts-{args.tag}.json", args.tag))
        return 0
    if args.remaining:
        return show_remaining(args)
    return run(args, args.results_dir)


def show_remaining(args: argparse.Namespace) -> int:
    from bench.readouts_plan import remaining, render

    chosen = chosen_tasks(args)
    if not chosen:
        return 2
    rows_file = args.results_dir / f"readouts-{args.tag}.jsonl"
    header, rows = read_rows(rows_file)
    if args.fresh:
        rows = {}
    elif header is not None:
        # As run() judges the rows: against --model where it is given, else the file's own.
        if args.model_given:
            from semif_proxy.model.files import model_sha256

            wanted = fingerprint(args.model, model_sha256(args.model))
        else:
            wanted = fingerprint(Path(str(header.get("model"))), str(header.get("model_sha256")))
        gone = superseded(header, wanted)
        if gone is None:
            return another_run(rows_file, header, wanted)
        # Rows of a replaced prompt version are asked again by the next run: not answered.
        rows = {k: r for k, r in rows.items() if r.get("prompt_version") not in gone}
    runs = [(c, p) for c in args.configs for p in args.permutations]
    print(f"{rows_file}: {len(chosen)} tasks per run")
    print(render(remaining(rows, chosen, runs, copied, args.recold)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

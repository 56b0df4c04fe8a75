"""docs/readouts.md and docs/img/readouts.png from bench/results/readouts-*.json (written by
`python -m bench.readouts --docs`; tests/test_bench_readouts.py checks they are current)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import readouts_failures as failures
from bench.readouts import PER_TYPE
from bench.readouts_summary import CONTINUATIONS

PAGE = Path("docs") / "readouts.md"
PLOT = Path("docs") / "img" / "readouts.png"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _acc(c: dict[str, Any] | None) -> str:
    if not c or not c["n"]:
        return "-"
    lo, hi = c["wilson95"]
    return f"{c['correct']}/{c['n']} = {_pct(c['accuracy'])} [{100 * lo:.0f}, {100 * hi:.0f}]"


def _diff(c: dict[str, Any]) -> str:
    vs = c.get("vs_letters")
    if not vs or vs["difference"] is None:
        return "(baseline)" if vs is None else "-"
    lo, hi = vs["bootstrap95"]
    return f"{100 * vs['difference']:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}] (n={vs['pairs']})"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1000 * s:,.0f} ms"


def _cost(c: dict[str, Any]) -> str:
    vs = c.get("vs_letters")
    if vs is None:
        return "1.00x / 1.00x"
    wall, cpu = vs["cost_ratio"], vs.get("cpu_cost_ratio")
    shown = " / ".join("-" if x is None else f"{x:.2f}x" for x in (wall, cpu))
    return shown + (f" (n={vs['cost_pairs']})" if vs.get("cost_pairs") else "")


def summaries(results: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("readouts-*.json"))]


def section(s: dict[str, Any]) -> list[str]:
    fp = s.get("fingerprint") or {}
    versions = ", ".join(f"{k} `{v}`" for k, v in (fp.get("prompt_versions") or {}).items())
    out = [
        f"## {s['tag']}",
        "",
        f"Model `{fp.get('model')}` (sha256 `{str(fp.get('model_sha256'))[:12]}`); prompts "
        f"{versions}. Source: `bench/results/readouts-{s['tag']}.json` (rows: `.jsonl`).",
        "",
        "| readout | perm. | accuracy [Wilson 95 %] | easy | original | hard | vs letters "
        "[bootstrap 95 %] | ECE | p50 | p95 | cost wall / CPU | load1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in s["runs"].values():
        a = r["by"]["all"]["all"]
        splits = [_acc(r["by"].get(k, {}).get("all")) for k in ("easy", "original", "hard")]
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        if r.get("older_numbers"):
            failed += f" ({r['older_numbers']} older numbers)"
        out.append(
            f"| {r['config']}{failed} | {r['permutations']} | {_acc(a)} | {' | '.join(splits)} | "
            f"{_diff(a)} | {a['ece']:.3f} | {_ms(a['latency_p50'])} | {_ms(a['latency_p95'])} | "
            f"{_cost(a)} | {r['load1_p50']:.1f} |"
        )
    out += [
        "",
        "By question type (all splits; vs letters: the paired difference):",
        "",
        "| readout | perm. | noul | choice | score |",
        "|---|---|---|---|---|",
    ]
    for r in s["runs"].values():
        kinds = []
        for kind in ("noul", "choice", "score"):
            c = r["by"]["all"].get(kind)
            kinds.append(_acc(c) + (f"; {_diff(c)}" if c and c.get("vs_letters") else ""))
        out.append(f"| {r['config']} | {r['permutations']} | {' | '.join(kinds)} |")
    return [*out, ""]


# The rule for a default (issue #35): on the realistic model, over every task (and for each
# question type alone, where a default is per type), a readout or correction whose paired
# difference against letters lies above zero at no more than 1.5x letters' p50.
MAX_COST = 1.5


def judged(runs: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any], list[str]]]:
    """The realistic model's one-order runs that the rule judges (not letters, the baseline;
    not a run by type, judged through its runs; not direct's choices, which are the rows of
    the letters config they are asked as), by question type ("all": every type together):
    (run, config, type, its cell, why it falls short; none where it meets the rule)."""
    base = runs.get("letters@1", {}).get("by", {}).get("all", {}).get("all", {}).get("n", 0)
    for name, r in runs.items():
        if r["permutations"] != "1" or r["config"] == "letters" or r["config"] in PER_TYPE:
            continue
        for kind, c in r["by"]["all"].items():
            if kind == "choice" and r["config"].startswith("direct"):
                continue  # asked with letters under direct: the letters rows themselves
            vs = c.get("vs_letters") or {}
            lo = (vs.get("bootstrap95") or [None])[0]
            cost = vs.get("cost_ratio")
            why = []
            if r["by"]["all"]["all"]["n"] < failures.TASKS:
                why.append(f"{r['by']['all']['all']['n']} of {failures.TASKS} tasks answered")
            elif base < failures.TASKS:  # paired over what letters answered: not yet all of them
                why.append(f"letters answered {base} of {failures.TASKS}")
            if lo is None or lo <= 0:
                why.append("its interval reaches zero" if lo is not None else "no interval")
            if cost is None or cost > MAX_COST:
                why.append(f"cost {cost:.2f}x" if cost is not None else "no cost measured")
            yield name, r["config"], kind, c, why


def verdicts(all_summaries: list[dict[str, Any]]) -> list[str]:
    """Whether any readout has earned the default, run by run and question type, from the
    numbers above; the default (SEMIF_READOUT) stays letters until one has."""
    out = [
        "## Defaults from the evidence",
        "",
        f"A readout or a correction becomes the server's default (SEMIF_READOUT, "
        f"SEMIF_BIAS_CORRECTION) once, on `{failures.REALISTIC}` over all {failures.TASKS} "
        f"tasks in one option order, its paired difference against letters has a 95 % interval "
        f"above zero at no more than {MAX_COST:g}x letters' p50 latency; per question type "
        "where the evidence is per type: a type whose own line falls short keeps letters with "
        "no correction, even where the rule is met over all types together (there, one type's "
        "cost is averaged with a cheaper type's). A run by question "
        f"type ({', '.join(f'`{c}`' for c in PER_TYPE)}) is judged through the runs it is made "
        "of: each of its types is one of theirs.",
        "",
    ]
    realistic = next((s for s in all_summaries if s["tag"] == failures.REALISTIC), None)
    runs = (realistic or {}).get("runs", {})
    met = []
    for name, config, kind, c, why in judged(runs):
        verdict = "meets the rule" if not why else "not yet: " + "; ".join(why)
        if not why:
            met.append(f"{config} ({kind})")
        out.append(f"- {name}, {kind}: {_diff(c)}, cost {_cost(c)}: {verdict}")
    if realistic is None:
        out.append(f"- no run of `{failures.REALISTIC}` yet")
    from semif_proxy.settings.readouts import BiasCorrections, Readouts

    out += [
        "",
        f"Met by: {', '.join(met)}. The server's defaults now: readout "
        f"`{Readouts().describe()}`, bias correction `{BiasCorrections().describe()}` "
        "(SEMIF_READOUT, SEMIF_BIAS_CORRECTION; settings/defaults.py says which evidence "
        "chose each)."
        if met
        else "No readout meets the rule yet: the default "
        "stays `letters` with no correction; each readout and correction is opt-in per question, "
        "or for a server by SEMIF_READOUT and SEMIF_BIAS_CORRECTION "
        '([method.md](method.md), "Other readouts", says what each is good for).',
        *normalization_verdict(runs),
        "",
    ]
    return out


def one_order_continuations(runs: dict[str, Any]) -> dict[str, Any]:
    """The continuation runs, one per normalization, asked in one option order."""
    return {
        name: r
        for name, r in runs.items()
        if r["config"] in CONTINUATIONS and r["permutations"] == "1"
    }


def chosen_normalization(runs: dict[str, Any]) -> str | None:
    """The normalization whose one-order continuation run, over all tasks, beats each other
    normalization's with a paired 95 % interval above zero; None when no run does (or any
    has not answered every task)."""
    mine = one_order_continuations(runs)
    if len(mine) < len(CONTINUATIONS):
        return None
    if any(r["by"]["all"]["all"]["n"] < failures.TASKS for r in mine.values()):
        return None
    for r in mine.values():
        against = r.get("vs_normalizations", {})
        if len(against) == len(CONTINUATIONS) - 1 and all(
            (vs["all"]["bootstrap95"] or [0])[0] > 0 for vs in against.values()
        ):
            return r["config"].removeprefix("continuation-")
    return None


def normalization_verdict(runs: dict[str, Any]) -> list[str]:
    """How a continuation question that names no normalization is read, and why."""
    from semif_proxy.settings.readouts import Normalizations

    out = [
        "",
        "A continuation question that names no normalization (SEMIF_NORMALIZATION) gets the "
        f"one that, on `{failures.REALISTIC}` over all {failures.TASKS} tasks in one option "
        "order, beats each other normalization with a paired 95 % interval above zero (its "
        "extra cost shown, not judged: a continuation is asked for, letters stay the default "
        "readout; each pair once, the more accurate first):",
        "",
    ]
    for name, r in one_order_continuations(runs).items():
        for other, vs in r.get("vs_normalizations", {}).items():
            c = vs["all"]
            if c["difference"] is None or (c["difference"], other) <= (0, name):
                continue  # the other way round, or none to show
            lo, hi = c["bootstrap95"]
            mine = r["by"]["all"]["all"].get("vs_letters", {}).get("cost_ratio")
            theirs = runs[other]["by"]["all"]["all"].get("vs_letters", {}).get("cost_ratio")
            cost = f", p50 {mine / theirs:.2f}x the other's" if mine and theirs else ""
            out.append(
                f"- {name} against {other}: {100 * c['difference']:+.1f} pt "
                f"[{100 * lo:+.1f}, {100 * hi:+.1f}] (n={c['pairs']}){cost}"
            )
    chosen = chosen_normalization(runs)
    now = Normalizations().describe()
    if chosen is None:
        out += ["", f"None does yet: the default stays `{now}`."]
    elif chosen == now:
        out += ["", f"Chosen: `{chosen}`, the server's default (settings/defaults.py)."]
    else:
        out += ["", f"Chosen: `{chosen}`; the server's default is `{now}`: they differ."]
    return out


def page(all_summaries: list[dict[str, Any]], failing: list[str] | None = None) -> str:
    out = [
        "# Readouts on JevBench",
        "",
        "<!-- generated by `python -m bench.readouts --docs` from bench/results/readouts-*.json;"
        " do not edit -->",
        "",
        "Every public JevBench task (easy, original, hard: 231 System One questions) asked under "
        "each readout of a System One question (`readout`, `normalization`, `bias_correction`; "
        "[docs/api.md](api.md)), in-process on the engine with the default settings, in one "
        "option order (perm. 1) and in every cyclic order (perm. N). Run: `python -m "
        "bench.readouts --model M.gguf --tag TAG` (resumable; `--help`; `--remaining --tag TAG` "
        "says what a run would still ask and about how long it takes).",
        "",
    ]
    notes = all_summaries[0]["notes"] if all_summaries else []
    out += [f"- {n}" for n in notes]
    out += [
        "- cost: p50 latency / letters' p50 at the same permutations, of wall seconds and of "
        "the process's CPU seconds, over the tasks both answered from a cold state (`cold` in "
        "the rows: no prefix held, the prefix cache cleared; the n after it counts them) on the "
        "engine the readout has now (`engine_cost` in the rows; deliberate's reasoning has "
        "come after the state's shared prefix since engine cost 2); other rows count in "
        "accuracy, not in cost or latency: `--recold` asks them again; ECE: 10 equal-width "
        "bins of the predicted label's probability",
        "- older numbers: rows answered before 2026-12-05 whose evaluation went after a held "
        "prefix (continuation's options, option orders after the first, deliberate's read), "
        "when a question after a held prefix was not yet cut into ubatches where its one-piece "
        "evaluation is (`engine_numbers` in the rows; on Qwen2.5 Q4_K_M a logit moved by up to "
        "0.33, on SmolLM2 none): they count as they are until `--recold` asks them again",
        "- each row is timed at its own load (load1); a run shares the machine with nothing "
        "else it starts, but what else ran at the time is the operator's",
        "",
    ]
    if not all_summaries:
        return "\n".join([*out, "No results yet.", ""])
    out += ["![accuracy per readout](img/readouts.png)", ""]
    out += verdicts(all_summaries)
    out += failing or []
    for s in all_summaries:
        out += section(s)
    return "\n".join(out)


def plot(all_summaries: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "figure.dpi": 100})
    rows = max(len(s["runs"]) for s in all_summaries)
    fig, axes = plt.subplots(
        1, len(all_summaries), figsize=(6.4 * len(all_summaries), 0.9 + 0.28 * rows), squeeze=False
    )
    for ax, s in zip(axes[0], all_summaries):
        names = list(s["runs"])
        cells = [s["runs"][n]["by"]["all"]["all"] for n in names]
        y = list(range(len(names)))[::-1]
        acc = [c["accuracy"] or 0.0 for c in cells]
        lo = [a - c["wilson95"][0] if c["n"] else 0 for a, c in zip(acc, cells)]
        hi = [c["wilson95"][1] - a if c["n"] else 0 for a, c in zip(acc, cells)]
        colours = ["#d62728" if n.endswith("@N") else "#1f77b4" for n in names]
        for yi, a, below, above, col in zip(y, acc, lo, hi, colours):
            ax.errorbar(a, yi, xerr=[[below], [above]], fmt="o", color=col, capsize=3)
        if "letters@1" in s["runs"]:
            ax.axvline(s["runs"]["letters@1"]["by"]["all"]["all"]["accuracy"], ls="--", c="grey")
        ax.set_yticks(y, [f"{n} (n={c['n']})" for n, c in zip(names, cells)])
        ax.set_xlim(0, 1)
        ax.set_xlabel("accuracy over the tasks answered (Wilson 95 %); blue: perm. 1, red: perm. N")
        ax.set_title(f"{s['tag']}: readouts on JevBench")
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def write_docs(root: Path, results: Path) -> list[Path]:
    found = summaries(results)
    target = root / PAGE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page(found, failures.section(results)), encoding="utf-8")
    written = [target]
    if found:
        (root / PLOT).parent.mkdir(parents=True, exist_ok=True)
        plot(found, root / PLOT)
        written.append(root / PLOT)
    return written

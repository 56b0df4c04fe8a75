"""What a resumable `python -m bench.readouts` run still has to ask (`--remaining`): per run
(config, permutations), the tasks answered, those a twin config's rows answer at no cost, those
left, and the minutes they should take at the seconds that run's rows took in the same split.
Read from the rows file alone: no model is loaded."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable
from statistics import fmean
from typing import Any

from bench.readouts_rows import ENGINE_NUMBERS, current, current_engine, engine_cost

Copier = Callable[..., "dict | None"]


def remaining(
    rows: dict[tuple, dict[str, Any]],
    tasks: Iterable[Any],
    runs: Iterable[tuple[str, str]],
    copied: Copier,
    recold: bool = False,
) -> list[dict[str, Any]]:
    """One entry per run, in the order a run asks them: total, asked, copies (a twin's row
    stands in, one already there or one an earlier run of this order will write), left and
    minutes (None where a split with tasks left has no row of that run to time it by, nor
    rows of it and of letters to scale letters' seconds there by). With `recold`, as
    --recold: a row whose numbers or seconds are not the engine's now (readouts_rows.current)
    is asked again."""
    tasks = list(tasks)
    # The rows this order would write (as run() does), for later twins to copy; the rows
    # themselves stay as they are, to time the tasks by.
    planned: dict[tuple, dict[str, Any]] = {}
    held = ChainMap(planned, rows)
    out = []
    for config, spec in runs:
        asked = copies = 0
        left: dict[str, int] = {}
        for t in tasks:
            key = (config, spec, t.file, t.id)
            row = rows.get(key)
            if row is not None and "error" not in row and not (recold and not current(row)):
                asked += 1
            elif copied(held, t, config, spec, recold) is not None:
                copies += 1
            else:
                left[t.file] = left.get(t.file, 0) + 1
                # Asked by this run (untimed here: no seconds), so a later twin copies it.
                planned[key] = {
                    "config": config,
                    "permutations": spec,
                    "cold": True,
                    "engine_cost": engine_cost(config),
                    "engine_numbers": ENGINE_NUMBERS,
                }
        minutes: float | None = 0.0
        for split, n in left.items():
            per_task = _seconds(rows, config, spec, split)
            if per_task is None:
                per_task = _scaled(rows, config, spec, split)
            if per_task is None:
                minutes = None
                break
            minutes += n * per_task / 60
        out.append(
            {
                "run": f"{config}@{spec}",
                "total": len(tasks),
                "asked": asked,
                "copies": copies,
                "left": sum(left.values()),
                "minutes": minutes,
            }
        )
    return out


def _times(rows: dict, config: str, spec: str, split: str | None) -> dict[tuple, float]:
    return {
        (f, i): r["seconds"]
        for (c, s, f, i), r in rows.items()
        if (c, s) == (config, spec)
        and split in (None, f)
        and "seconds" in r
        and not ({"error", "copied_from"} & r.keys())  # a copy's seconds: its twin's
        and current_engine(r)  # an older engine's seconds are not what is left
    }


def _seconds(rows: dict, config: str, spec: str, split: str) -> float | None:
    """The mean seconds of the run's rows in this split (None: it has none there)."""
    seen = _times(rows, config, spec, split)
    return fmean(seen.values()) if seen else None


def _scaled(rows: dict, config: str, spec: str, split: str) -> float | None:
    """For a split the run has not reached: letters' mean seconds there (same permutations),
    times the run's cost against letters over the tasks both answered."""
    base = _seconds(rows, "letters", spec, split)
    ours, theirs = _times(rows, config, spec, None), _times(rows, "letters", spec, None)
    both = ours.keys() & theirs.keys()
    if base is None or not both:
        return None
    return base * fmean(ours[k] for k in both) / fmean(theirs[k] for k in both)


def _minutes(entry: dict[str, Any]) -> str:
    if not entry["left"]:
        return "-"
    if entry["minutes"] is None:
        return "?"
    return "<1" if entry["minutes"] < 0.5 else f"{entry['minutes']:.0f}"


def render(entries: list[dict[str, Any]]) -> str:
    """The entries as an aligned table and a total line."""
    head = ("run", "asked", "copies", "left", "minutes")
    lines = [
        (
            e["run"],
            f"{e['asked']}/{e['total']}",
            str(e["copies"]),
            str(e["left"]),
            _minutes(e),
        )
        for e in entries
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    text = [
        "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
        for r in (head, *lines)
    ]
    known = [e for e in entries if e["left"] and e["minutes"] is not None]
    unknown = [e for e in entries if e["left"] and e["minutes"] is None]
    parts = []
    if known:
        parts.append(
            f"about {_minutes({'left': 1, 'minutes': sum(e['minutes'] for e in known)})}"
            f" minutes for {len(known)} run{'s' * (len(known) != 1)}"
        )
    if unknown:
        parts.append(
            f"{len(unknown)} run{'s' * (len(unknown) != 1)} marked ? (no rows of theirs, or of "
            "letters at the same permutations, to time them by)"
        )
    total = f"left: {sum(e['left'] for e in entries)} tasks" + (
        f": {'; '.join(parts)}" if parts else ""
    )
    return "\n".join([*text, total])

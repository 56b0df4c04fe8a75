"""The rows file of `python -m bench.readouts` (bench/results/readouts-TAG.jsonl): its first
line the fingerprint of what was measured, then one line per (config, permutations, task)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

FORMAT = 1
# Where the engine's work for a readout changed, the rows answered before keep their numbers
# (the change is tested to give the same ones, bit for bit) but not their seconds: per readout,
# the engine cost its rows must carry (`engine_cost`; a row without one: 1) for their seconds
# to count in cost and latency. deliberate 2: the reasoning generated after the state's shared
# prefix, evaluated once for every option order and kept for the read (before: each order's
# whole prompt, and the state again for the read).
ENGINE_COSTS = {"deliberate": 2}


def readout_of(config: str) -> str:
    """The readout a config's engine work is that of: its name before a correction, with
    continuation's normalisations one readout."""
    name = config.split("+")[0]
    return "continuation" if name.startswith("continuation") else name


def engine_cost(config: str) -> int:
    return ENGINE_COSTS.get(readout_of(config), 1)


def current_engine(row: dict[str, Any]) -> bool:
    """Whether a row was answered by the engine its readout has now (a copied row: the readout
    of the config it came from)."""
    source = row.get("copied_from") or row["config"]
    return row.get("engine_cost", 1) >= engine_cost(source)


# Where the engine's numbers changed: every row answered now carries ENGINE_NUMBERS
# (`engine_numbers`; a row without one: 1). 2 (2026-12-05): a question after a held prefix is
# cut into ubatches where its one-piece stream is cut; on Qwen2.5 Q4_K_M its logits had moved
# by up to 0.33 against the one-piece evaluation before (SmolLM2 Q4_1: bit-identical before
# too). Rows answered before whose evaluation went after a held prefix (continuation's options,
# every option order after the first, deliberate's read since engine cost 2) carry the old
# numbers; the others were one-piece, as now.
ENGINE_NUMBERS = 2


def numbers_current(row: dict[str, Any]) -> bool:
    """Whether a row's numbers are what the engine gives now."""
    if row.get("engine_numbers", 1) >= ENGINE_NUMBERS:
        return True
    readout = readout_of(row.get("copied_from") or row["config"])
    if readout == "per-type":  # asked itself: as the readout its question type applied
        readout = readout_of(str(row.get("applied", "")))
    held = readout == "continuation" or str(row.get("permutations", "1")) != "1"
    held = held or (readout == "deliberate" and row.get("engine_cost", 1) >= 2)
    return not held


def current(row: dict[str, Any]) -> bool:
    """Whether a row stays under --recold: its numbers and its seconds are the engine's now."""
    return timed(row) and numbers_current(row)


def timed(row: dict[str, Any]) -> bool:
    """Whether a row's seconds count: timed from a cold state (bench/readouts.py cold_start) on
    the engine its readout has now."""
    return bool(row.get("cold")) and current_engine(row)


def row_key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return (row["config"], str(row["permutations"]), row["split"], row["id"])


def fingerprint(model: Path, sha256: str) -> dict[str, Any]:
    from semif_proxy.engine import readout_prompts
    from semif_proxy.engine.prompt import NUMBER_LABELS, PROMPT_VERSION

    return {
        "format": FORMAT,
        "model": model.name,
        "model_sha256": sha256,
        "prompt_versions": {
            "letters": PROMPT_VERSION,
            "numbers": NUMBER_LABELS.prompt_version,
            "continuation": readout_prompts.CONTINUATION_VERSION,
            "direct_yes_no": readout_prompts.YES_NO_VERSION,
            "direct_levels": readout_prompts.LEVELS_VERSION,
            "deliberate": readout_prompts.DELIBERATE_VERSION,
        },
    }


def superseded(held: dict[str, Any], wanted: dict[str, Any]) -> set[str] | None:
    """What of the rows under `held` no longer means what `wanted` would measure: None when
    nothing does (another format or model), else the prompt versions `wanted` replaced (empty:
    every row still holds). A readout added since (a version `held` does not name) leaves the
    rows already there as they were; a readout whose version changed has its rows asked again
    (each row names the version that made it)."""
    if {k: v for k, v in held.items() if k != "prompt_versions"} != {
        k: v for k, v in wanted.items() if k != "prompt_versions"
    }:
        return None
    old, new = held.get("prompt_versions", {}), wanted.get("prompt_versions", {})
    return {version for name, version in old.items() if new.get(name) != version}


def rewrite(path: Path, header: dict[str, Any], rows: dict[tuple, dict[str, Any]]) -> None:
    """The rows file as `header` and these rows (written whole, then moved into place)."""
    lines = [json.dumps({"fingerprint": header})] + [json.dumps(r) for r in rows.values()]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


@contextmanager
def appending(path: Path) -> Iterator[IO[str]]:
    """The rows file open to append rows to, on a line of their own: a kill can leave the last
    line cut short (read_rows skips it)."""
    cut = False
    if path.exists() and path.stat().st_size:
        with path.open("rb") as last:  # its last byte only: the file grows to megabytes
            last.seek(-1, os.SEEK_END)
            cut = last.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as f:
        if cut:
            f.write("\n")
        yield f


def read_rows(path: Path) -> tuple[dict[str, Any] | None, dict[tuple, dict[str, Any]]]:
    """The fingerprint line and the rows by key (a later line of a key wins: a retried error)."""
    header, rows = None, {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill: that task is asked again
            if "fingerprint" in item:
                header = header or item["fingerprint"]
            else:
                rows[row_key(item)] = item
    return header, rows

"""The rows file of `python -m bench.readouts` (bench/results/readouts-TAG.jsonl): its first
line the fingerprint of what was measured, then one line per (config, permutations, task)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = 1


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

"""The concurrency benchmark's code path, end to end on the small model: `python -m bench
concurrency` with 2 clients, 2 prompts and 1 round writes a results file with both sides (the
proxy and a stock llama-server), positive rates and the ratio; and its busy-time shares add
up to the time anything was in flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common, concurrency
from bench import run as bench_run

# It starts the proxy and a stock llama-server and runs them loaded: alone, after the rest.
pytestmark = pytest.mark.serial


def test_shares_add_up_to_the_busy_time() -> None:
    spans = [(0.0, 4.0), (1.0, 2.0), (1.0, 3.0), (5.0, 6.0)]
    got = concurrency.shares(spans)
    # 0-1 alone; 1-2 three in flight; 2-3 two; 3-4 alone; 4-5 idle; 5-6 alone.
    assert got == pytest.approx([1 + 1 / 3 + 1 / 2 + 1, 1 / 3, 1 / 3 + 1 / 2, 1.0])
    assert sum(got) == pytest.approx(5.0)


@pytest.mark.timeout(600)  # two server starts; minutes where other work shares the cores
def test_concurrency_suite_writes_both_sides(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    argv = ["--model", str(model_path), "--tag", "t", "concurrency", "--clients", "2"]
    argv += ["--prompts", "2", "--rounds", "1", "--concurrency-chat-tokens", "4"]
    assert bench_run.main(argv) == 0
    result = json.loads((tmp_path / "concurrency-t.json").read_text())
    stock = f"stock-{result['proxy']['layout']}"
    assert set(result["raw"]) == {"proxy", stock}
    assert result["stock_servers"][stock]["argv"][0] == "llama-server"
    assert "--parallel" in result["stock_servers"][stock]["argv"]
    assert result["prompts_checked"] == 2  # the stock side scored the proxy's own prompts
    s = result["summary"]
    for side in ("proxy", stock):
        assert len(result["raw"][side]["decisions"]) == 2
        assert s["decisions_per_s"][side]["point"] > 0
        assert s["chat_tokens_per_s"][side]["point"] > 0
    assert s["reference"] == stock and s["decisions_ratio"]["point"] > 0
    assert s["chat_ratio"]["point"] > 0
    assert "concurrency" in (tmp_path / "summary-t.md").read_text()

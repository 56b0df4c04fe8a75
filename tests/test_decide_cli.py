"""`semif-proxy decide`, llama-server parity of the rendered prompt, and the Qwen routing check."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.engine import DecisionEngine
from semif_proxy.prompt import render_decision
from tests.conftest import engine_settings
from tests.test_engine import OPTIONS, STATE, decision


def test_decide_command_prints_the_response(model_path: Path, tmp_path: Path) -> None:
    request = {
        "decision": {
            "id": "r",
            "state": STATE,
            "question": "Which queue?",
            "options": [{"id": i, "description": d} for i, d in OPTIONS],
        }
    }
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    out = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "decide", str(path), "--model", str(model_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)["result"]
    assert result["option_ids"] == [i for i, _ in OPTIONS]
    assert sum(result["probabilities"]) == pytest.approx(1.0)
    path.write_text(json.dumps({"decision": {**request["decision"], "options": []}}))
    bad = subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "decide", str(path), "--model", str(model_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"]["field"] == "decision.options"


def test_rendered_prompt_matches_llama_server(
    decision_engine: DecisionEngine, llama_server_url: str
) -> None:
    """The same rendered text, scored by llama-server's /completion, gives the same
    next-token distribution as our engine (same tokenization, same logits)."""
    d = decision()
    text = render_decision(
        decision_engine.template, d.state, d.question, [o.description for o in d.options]
    ).text
    body = json.dumps(
        {
            "prompt": text,
            "n_predict": 1,
            "n_probs": 20,
            "temperature": 0,
            "cache_prompt": False,
            "post_sampling_probs": False,
            "return_tokens": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"{llama_server_url}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = json.load(resp)
    assert data["tokens_evaluated"] == len(decision_engine.tokenize_prompt(text))
    top = data["completion_probabilities"][0]["top_logprobs"]
    ids = [int(t["id"]) for t in top]
    tokens = decision_engine.tokenize_prompt(text)
    logits, lse, _ = decision_engine.core.score(tokens, [[]], ids)
    np.testing.assert_allclose(logits[0] - lse[0], [t["logprob"] for t in top], atol=2e-3)


@pytest.mark.slow
@pytest.mark.xfail(
    reason="measured: Qwen2.5-Coder-0.5B puts 0.377 on billing and 0.332 on account_access with "
    "prompt semif-letter-v1 (allowed mass 0.95); the prompt needs work (issue 3 note)",
    strict=True,
)
def test_qwen_routes_password_reset_to_account_access(qwen_path: Path) -> None:
    engine = DecisionEngine.load(engine_settings(qwen_path, n_ctx=2048))
    try:
        [result], _ = engine.decide([decision()], ["decision"])
        best = result["option_ids"][int(np.argmax(result["probabilities"]))]
        assert best == "account_access" and max(result["probabilities"]) > 0.5
    finally:
        engine.close()

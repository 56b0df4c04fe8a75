"""One model, one answer: with default settings, a decision's letter probabilities are the
next-token distribution that the same server's own `/completion` reports for the decision's
prompt (both paths run flash attention off), through the proxy, on every model we ship checks
for; and the realistic 1.5B model routes the README's ticket where it belongs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.engine.examples import ROUTING_OPTIONS as OPTIONS
from semif_proxy.engine.examples import ROUTING_STATE as STATE
from semif_proxy.testing.server import ProxyProcess

# Default settings: none of the test harness's thread or slot pinning.
DEFAULTS: dict[str, str | None] = {"SEMIF_THREADS": None, "SM_LLAMA_CPP_PARALLEL": None}


def routing(options: list[tuple[str, str]] = OPTIONS) -> dict:
    return {
        "decision": {
            "id": "route-1",
            "state": STATE,
            "question": "Which support queue should handle this ticket?",
            "options": [{"id": i, "description": d} for i, d in options],
            "return_prompt": True,
        }
    }


def check_one_answer(server: ProxyProcess, options: list[tuple[str, str]]) -> dict:
    result = server.call("POST", "/v1/decisions", routing(options)).json()["result"]
    completion = server.call(
        "POST",
        "/completion",
        {
            "prompt": result["prompt"],
            "n_predict": 1,
            "n_probs": 50,
            "temperature": 0,
            "cache_prompt": False,
            "post_sampling_probs": False,
        },
    )
    assert completion.status == 200, completion.body[:300]
    top = completion.json()["completion_probabilities"][0]["top_logprobs"]
    theirs = {t["token"]: t["logprob"] for t in top}
    letters = np.array([theirs["ABCDEFGH"[i]] for i in range(len(options))])
    np.testing.assert_allclose(
        result["probabilities"], np.exp(letters) / np.exp(letters).sum(), atol=1e-3, rtol=0
    )
    assert result["allowed_token_mass"] == pytest.approx(np.exp(letters).sum(), abs=1e-3)
    return result


@pytest.fixture(scope="module")
def smollm(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    log = tmp_path_factory.mktemp("logs") / "one-answer.log"
    server = ProxyProcess(model_path, DEFAULTS, log_path=log).start()
    yield server
    server.stop()


def test_decision_equals_the_servers_own_completion(smollm: ProxyProcess) -> None:
    for shift in range(len(OPTIONS)):
        check_one_answer(smollm, OPTIONS[shift:] + OPTIONS[:shift])


def test_llama_server_runs_flash_attention_off_unless_told(smollm: ProxyProcess) -> None:
    argv = next(li for li in smollm.log_lines() if '"llama_server_start"' in li and '"argv"' in li)
    assert '"--flash-attn", "off"' in argv


@pytest.mark.slow
def test_qwen_decision_equals_the_servers_own_completion(qwen_path: Path) -> None:
    server = ProxyProcess(qwen_path, DEFAULTS).start(timeout=300)
    try:
        for shift in range(len(OPTIONS)):
            check_one_answer(server, OPTIONS[shift:] + OPTIONS[:shift])
    finally:
        server.stop()


@pytest.mark.slow
def test_qwen15_routes_password_reset_to_account_access(qwen15_path: Path) -> None:
    """Issue 3's routing check on a model big enough to read the ticket: in the request's own
    option order (one pass, no rotations), and in every other rotation too."""
    server = ProxyProcess(qwen15_path, DEFAULTS).start(timeout=600)
    try:
        for shift in range(len(OPTIONS)):
            order = OPTIONS[shift:] + OPTIONS[:shift]
            result = check_one_answer(server, order)
            probs = dict(zip(result["option_ids"], result["probabilities"]))
            assert max(probs, key=probs.get) == "account_access", (shift, probs)
            assert probs["account_access"] > 0.5, (shift, probs)
    finally:
        server.stop()

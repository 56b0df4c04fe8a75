"""`semif-proxy decide`, llama-server parity of the rendered prompt, and the Qwen routing check."""

from __future__ import annotations

import itertools
import json
import os
import pty
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semif_proxy.api.decisions import decide
from semif_proxy.engine.examples import ROUTING_OPTIONS as OPTIONS
from semif_proxy.engine.examples import ROUTING_STATE as STATE
from semif_proxy.engine.prompt import render_decision
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.testing.server import ProxyProcess
from tests.conftest import GPU_LAYERS, engine_settings, running_llama_server
from tests.test_engine import decision


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


def routing(decision_id: str, state: str = STATE) -> dict:
    return {
        "id": decision_id,
        "state": state,
        "question": "Which queue?",
        "options": [{"id": i, "description": d} for i, d in OPTIONS],
    }


def decide_cli(
    *args: str, input: str | None = None, stdin: Any = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semif_proxy.cli", "decide", *args],
        input=input,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def decisions_server(model_path: Path) -> Iterator[ProxyProcess]:
    server = ProxyProcess(model_path, {"SEMIF_CHAT": "off"}).start()
    yield server
    server.stop()


@pytest.mark.timeout(600)  # three runs of the command, each loading the model
def test_decide_reads_stdin_one_body_or_json_lines(
    model_path: Path, tmp_path: Path, decisions_server: ProxyProcess
) -> None:
    model = ["--model", str(model_path)]
    # One body on stdin, not named (stdin is a pipe, not a terminal): the server's answer.
    request = {"decision": routing("r")}
    piped = decide_cli(*model, input=json.dumps(request))
    assert piped.returncode == 0, piped.stderr
    ours = json.loads(piped.stdout)["result"]
    theirs = decisions_server.call("POST", "/v1/decisions", request, timeout=120).json()["result"]
    assert ours["option_ids"] == theirs["option_ids"]
    np.testing.assert_allclose(ours["probabilities"], theirs["probabilities"], atol=1e-3)
    # JSON Lines: one answer line per line; each bad line gets its error object on its line,
    # as the server's own JSON Lines answer them (the same body sent to /invocations).
    lines = [
        json.dumps({"decision": routing("a")}),
        '{"decision": ',
        json.dumps({"decision": {**routing("b"), "options": []}}),
        "",
        "[1, 2]",
        json.dumps({"decisions": [routing("c"), {**routing("d"), "question": "Which team?"}]}),
    ]
    body = "\n".join(lines) + "\n"
    answered = decide_cli("-", *model, input=body)
    assert answered.returncode == 1, answered.stderr  # some lines were refused
    ours = [json.loads(line) for line in answered.stdout.splitlines()]
    reply = decisions_server.call(
        "POST",
        "/invocations",
        raw=body.encode(),
        headers={"Content-Type": "application/jsonlines"},
        timeout=120,
    )
    assert reply.status == 200, reply.body[:300]
    theirs = [json.loads(line) for line in reply.body.decode().splitlines()]
    assert len(ours) == len(theirs) == len(lines)
    for number, (mine, server) in enumerate(zip(ours, theirs), 1):
        assert ("error" in mine) == ("error" in server), (number, mine, server)
        if "error" in server:
            assert mine["line"] == server["line"] == number
            assert mine["status"] == server["status"]
            assert {k: v for k, v in mine["error"].items() if k != "request_id"} == {
                k: v for k, v in server["error"].items() if k != "request_id"
            }
            continue
        mine_results = mine.get("results") or [mine["result"]]
        server_results = server.get("results") or [server["result"]]
        for a, b in zip(mine_results, server_results, strict=True):
            assert a["option_ids"] == b["option_ids"]
            np.testing.assert_allclose(a["probabilities"], b["probabilities"], atol=1e-3)
    assert [("error" in o) for o in ours] == [False, True, True, True, True, False]
    # Every line a request: all answered is exit 0; a *.jsonl file of one line is JSON Lines.
    one = tmp_path / "one.jsonl"
    one.write_text(lines[0] + "\n")
    single = decide_cli(str(one), *model)
    assert single.returncode == 0, single.stderr
    [line] = single.stdout.splitlines()
    assert json.loads(line)["result"]["option_ids"] == ours[0]["result"]["option_ids"]


def test_decide_bad_input_is_one_line_and_exit_2(model_path: Path, tmp_path: Path) -> None:
    model = ["--model", str(model_path)]
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "cut.json").write_text('{"decision": {"id": ')
    (tmp_path / "bad.gguf").write_bytes(b"not a model at all")
    (tmp_path / "request.json").write_text(json.dumps({"decision": routing("r")}))
    master, slave = pty.openpty()
    try:
        cases = [
            (decide_cli(str(tmp_path / "none.json"), *model), "none.json: no such file"),
            (decide_cli(str(tmp_path), *model), "cannot read"),
            (decide_cli("-", *model, input=""), "empty input"),
            (decide_cli(str(tmp_path / "cut.json"), *model), "cut.json: not JSON"),
            (decide_cli(str(tmp_path / "list.json"), *model), "must be a JSON object"),
            (decide_cli(*model, stdin=slave), "give a request file, or pipe one on stdin"),
            (
                decide_cli(str(tmp_path / "request.json"), "--model", str(tmp_path / "bad.gguf")),
                "the model does not load",
            ),
        ]
    finally:
        os.close(master)
        os.close(slave)
    for out, says in cases:
        assert out.returncode == 2, (says, out.returncode, out.stderr)
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("semif-proxy decide: ") and says in out.stderr, out.stderr
        assert out.stdout == ""


def server_top_logprobs(url: str, text: str, n_probs: int = 20) -> dict:
    """llama-server's own next-token log-probabilities for a text (one token, no sampling)."""
    body = json.dumps(
        {
            "prompt": text,
            "n_predict": 1,
            "n_probs": n_probs,
            "temperature": 0,
            "cache_prompt": False,
            "post_sampling_probs": False,
            "return_tokens": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"{url}/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def test_rendered_prompt_matches_llama_server(
    decision_engine: DecisionEngine, llama_server_url: str
) -> None:
    """The same rendered text, scored by llama-server's /completion, gives the same
    next-token distribution as our engine (same tokenization, same logits)."""
    d = decision()
    text = render_decision(
        decision_engine.template, d.state, d.question, [o.description for o in d.options]
    ).text
    data = server_top_logprobs(llama_server_url, text)
    assert data["tokens_evaluated"] == len(decision_engine.tokenize_prompt(text))
    top = data["completion_probabilities"][0]["top_logprobs"]
    ids = [int(t["id"]) for t in top]
    tokens = decision_engine.tokenize_prompt(text)
    logits, lse, _ = decision_engine.core.score(tokens, [[]], ids)
    np.testing.assert_allclose(logits[0] - lse[0], [t["logprob"] for t in top], atol=2e-3)
    # And the decision itself (prefix + branch, as served) reports the same letter distribution.
    [result], _ = decide(decision_engine, [d], ["decision"])
    theirs = {t["token"]: t["logprob"] for t in top}
    letters = np.array([theirs[letter] for letter in "ABC"])
    np.testing.assert_allclose(
        result["probabilities"], np.exp(letters) / np.exp(letters).sum(), atol=2e-3
    )
    assert result["allowed_token_mass"] == pytest.approx(np.exp(letters).sum(), abs=2e-3)


@pytest.fixture(scope="module")
def qwen_engine(qwen_path: Path) -> Iterator[DecisionEngine]:
    engine = DecisionEngine.load(engine_settings(qwen_path, n_ctx=2048))
    yield engine
    engine.close()


@pytest.mark.slow
def test_qwen_decisions_equal_llama_server_in_every_option_order(
    qwen_engine: DecisionEngine, qwen_path: Path
) -> None:
    """What the routing check below measures is the model, not our engine: in every order of
    the options, our probabilities and logits are llama-server's own letter distribution."""
    repack = qwen_engine.model_info["repack"]["on"]
    with running_llama_server(qwen_path, repack=repack) as url:
        for order in itertools.permutations(OPTIONS):
            d = decision(options=list(order))
            [result], _ = decide(qwen_engine, [d.model_copy(update={"return_prompt": True})], ["d"])
            top = server_top_logprobs(url, result["prompt"])["completion_probabilities"][0]
            theirs = {t["token"]: t["logprob"] for t in top["top_logprobs"]}
            letters = np.array([theirs[letter] for letter in "ABC"])
            np.testing.assert_allclose(
                result["probabilities"], np.exp(letters) / np.exp(letters).sum(), atol=2e-3
            )
            assert result["allowed_token_mass"] == pytest.approx(np.exp(letters).sum(), abs=2e-3)


@pytest.mark.slow
def test_qwen_questions_in_one_request_equal_single_requests(qwen_engine: DecisionEngine) -> None:
    """Bit for bit on the CPU, for a model whose attention kernels chunk differently from
    SmolLM2's (batched side-by-side branches differed here by up to 0.12 in a logit)."""
    for words in (1, 4, 7):
        state = "Customer email: " + " ".join(["reset"] * words) + " link never arrives."
        d = decision(state=state).model_copy(update={"permutations": 3})
        [mixed], _ = decide(qwen_engine, [d], ["decision"])
        for shift, row in enumerate(mixed["rotations"]["option_logits"]):
            qwen_engine.core.reset()
            [one], _ = decide(
                qwen_engine,
                [decision(state=state, options=OPTIONS[shift:] + OPTIONS[:shift])],
                ["decision"],
            )
            by_id = dict(zip(one["option_ids"], one["option_logits"]))
            tol = 0 if GPU_LAYERS == 0 else 1e-3
            np.testing.assert_allclose(row, [by_id[i] for i, _ in OPTIONS], atol=tol, rtol=0)


@pytest.mark.slow
@pytest.mark.xfail(
    reason="measured: Qwen2.5-Coder-0.5B Q4_K_M puts 0.386 on billing, 0.332 on account_access "
    "(allowed mass 0.95, the same numbers llama-server gives); over all 6 option orders "
    "P(account_access) is 0.28-0.39 and follows the position, under 11 system texts tried; "
    "greedy chat through llama-server names account access in 1 of 6 orders. The model's "
    "position preference, not the method: see the permutations test below and bench `order`",
    strict=True,
)
def test_qwen_routes_password_reset_to_account_access(qwen_engine: DecisionEngine) -> None:
    [result], _ = decide(qwen_engine, [decision()], ["decision"])
    best = result["option_ids"][int(np.argmax(result["probabilities"]))]
    assert best == "account_access" and max(result["probabilities"]) > 0.5


@pytest.mark.slow
def test_qwen_routes_password_reset_when_the_option_order_is_averaged(
    qwen_engine: DecisionEngine,
) -> None:
    """With every rotation of the options (each option once in each position) the position
    preference cancels and the evidence decides: account_access gets the most mass. Measured
    margin is small (0.342 vs 0.335 billing, 0.323 shipping): the content signal of this 0.5B
    model is weak, its position preference strong (bench `order` suite)."""
    [result], _ = decide(
        qwen_engine, [decision().model_copy(update={"permutations": 3})], ["decision"]
    )
    probs = dict(zip(result["option_ids"], result["probabilities"]))
    assert max(probs, key=probs.get) == "account_access"
    assert result["rotations"]["orders"] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]

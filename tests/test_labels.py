"""1 to 255 options: letters up to 26, numbered labels beyond (label sequences scored through a
token tree), the end of the answer scored after a label that prefixes another, and one option
answered without the model."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.api.systemone import build_spec
from semif_proxy.api.systemone_schemas import ScoreQuestion
from semif_proxy.engine import label_tree
from semif_proxy.engine.prompt import (
    MAX_OPTIONS,
    NUMBER_LABELS,
    ChatTemplate,
    check_numbers,
    labels_for,
    render_decision,
)
from semif_proxy.engine.questions import SEQUENCE_READOUT, SINGLE_OPTION, Question
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess
from tests.conftest import StartApp, engine_settings
from tests.helpers.app_server import AppServer
from tests.helpers.one_piece import continuation_logprobs

STATE = "The ticket says: I cannot log in since the password reset email never arrived."


# -- the tree, on a model written down here ------------------------------------------------------


def toy_logprob(context: tuple[int, ...], token: int, vocab: int = 6) -> float:
    """A fixed next-token distribution per context: any function of the context will do."""
    rng = np.random.default_rng(abs(hash(context)) % (2**32))
    logits = rng.normal(size=vocab) * 2.0
    return float(logits[token] - np.log(np.exp(logits).sum()))


def toy_rows(tree: label_tree.LabelTree, prompt: tuple[int, ...]):
    """What the engine returns for the tree, computed from toy_logprob (logsumexp 0: the rows
    hold log-probabilities already)."""
    root = np.array([toy_logprob(prompt, t) for t in tree.root_ids])
    contexts: list[tuple[int, ...]] = []
    for i, token in enumerate(tree.tokens):
        parent = tree.parent[i]
        contexts.append((contexts[parent] if parent >= 0 else ()) + (token,))
    nodes = [
        np.array([toy_logprob(prompt + c, t) for t in tree.ids[i]]) for i, c in enumerate(contexts)
    ]
    return root, 0.0, nodes, [0.0] * len(nodes)


def test_a_label_that_prefixes_another_is_scored_with_the_end_token() -> None:
    end = 5
    tree = label_tree.build([(1,), (1, 2), (3,), (1, 2, 4)], end)
    assert tree.sequences == ((1, end), (1, 2, end), (3,), (1, 2, 4))
    logprobs = tree.logprobs(*toy_rows(tree, (0,)))
    for seq, got in zip(tree.sequences, logprobs):
        want = sum(toy_logprob((0, *seq[:k]), seq[k]) for k in range(len(seq)))
        assert got == pytest.approx(want, abs=1e-12)
    # Prefix-free: a proper share of the distribution, whatever the model says.
    assert math.exp(np.logaddexp.reduce(logprobs)) <= 1.0 + 1e-12


def test_without_the_end_token_the_same_labels_would_overcount() -> None:
    # The reason for the end token: "1" would otherwise count every answer starting with 1,
    # "12" included, and the label probabilities could sum past 1.
    labels = [(1,), (1, 2), (3,)]
    naive = [sum(toy_logprob((0, *s[:k]), s[k]) for k in range(len(s))) for s in labels]
    scored = label_tree.build(labels, 5).logprobs(*toy_rows(label_tree.build(labels, 5), (0,)))
    assert naive[0] > scored[0]  # "1" alone is less likely than "1 followed by anything"


def test_the_tree_decodes_each_shared_prefix_once() -> None:
    digits = {str(d): 10 + d for d in range(10)}
    numbers = [tuple(digits[c] for c in str(i + 1)) for i in range(MAX_OPTIONS)]
    tree = label_tree.build(numbers, 99)
    # 1..9 and 10..25 prefix other labels; nothing else needs its own position.
    assert tree.nodes == 25
    assert len(tree.root_ids) == 9
    with pytest.raises(label_tree.LabelError):
        label_tree.build([(1,), (1,)], 99)


def test_labels_switch_to_numbers_past_26() -> None:
    assert labels_for(26).name == "letters" and labels_for(27).name == "numbers"
    assert labels_for(2, "numbers") is NUMBER_LABELS
    with pytest.raises(ValueError):
        NUMBER_LABELS.of(MAX_OPTIONS + 1)


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_model: Path) -> Iterator[DecisionEngine]:
    # The tiny model writes a byte per token: 255 options make a 14k-token prompt.
    engine = DecisionEngine.load(engine_settings(tiny_model, prefix_cache_mb=0, n_ctx=16384))
    yield engine
    engine.close()


def ask(n: int, question: str = "Which option fits?") -> Question:
    return Question(
        path="decision",
        id="d",
        state=STATE,
        question=question,
        descriptions=tuple(f"option number {i}" for i in range(n)),
    )


def test_numbered_labels_are_label_sequence_probabilities(tiny_engine: DecisionEngine) -> None:
    # The tiny model's byte vocabulary writes 10, 11 and 12 as two digits: "1" prefixes them.
    n = 30
    scored = tiny_engine.evaluate([ask(n)]).scored[0]
    assert scored.readout == SEQUENCE_READOUT and scored.prompt_version == "semif-number-v1"
    tree = tiny_engine.tree_for(n)
    assert tree.sequences[0][-1] == tiny_engine.numbers.end  # "1" then the end of the turn
    # An independent path: the whole prompt and each label evaluated in one piece, no tree.
    full = tiny_engine.tokenize_prompt(scored.prompt)
    direct = continuation_logprobs(tiny_engine.core, full, [list(s) for s in tree.sequences])
    np.testing.assert_allclose(scored.option_logits, direct, atol=1e-3)
    total = float(np.exp(np.logaddexp.reduce(scored.option_logits)))
    assert total <= 1.0 and scored.allowed_token_mass == pytest.approx(total, rel=1e-9)
    assert scored.probabilities.sum() == pytest.approx(1.0)
    assert scored.probabilities == pytest.approx(np.exp(scored.option_logits) / total)


def test_first_label_tokens_equal_a_one_piece_evaluation(tiny_engine: DecisionEngine) -> None:
    n = 40
    evaluation = tiny_engine.evaluate([ask(n), ask(3, "Another?")])
    scored = evaluation.scored[0]
    assert evaluation.timing["mode"] == "shared_prefix" and evaluation.timing["prompt_heads"] == 2
    tree = tiny_engine.tree_for(n)
    tiny_engine.core.reset()
    whole, _, _ = tiny_engine.core.score(
        tiny_engine.tokenize_prompt(scored.prompt), [[]], tree.root_ids
    )
    tiny_engine.core.reset()
    expected = [whole[0][tree.first_token_index(i)] for i in range(n)]
    assert scored.first_token_logits is not None
    assert list(scored.first_token_logits) == [float(v) for v in expected]  # bit for bit


def test_255_options_fit_one_request(tiny_engine: DecisionEngine) -> None:
    evaluation = tiny_engine.evaluate([ask(MAX_OPTIONS)])
    scored = evaluation.scored[0]
    assert len(scored.probabilities) == MAX_OPTIONS
    assert scored.probabilities.sum() == pytest.approx(1.0)
    # 25 tree nodes, 23 leaves taken 7 at a time (SEMIF_PARALLEL 8 - 1): "1" and "2" are
    # decoded again in the groups that need them, 27 tree tokens after the question's own.
    assert tiny_engine.tree_for(MAX_OPTIONS).nodes == 25
    own = scored.input_tokens - evaluation.timing["prefix_tokens"]
    assert evaluation.timing["suffix_tokens"] == own + 27


def test_one_option_is_answered_without_the_model(tiny_engine: DecisionEngine) -> None:
    before = tiny_engine.core.tokens_evaluated
    evaluation = tiny_engine.evaluate([ask(1)])
    assert tiny_engine.core.tokens_evaluated == before
    scored = evaluation.scored[0]
    assert scored.readout == SINGLE_OPTION and list(scored.probabilities) == [1.0]
    assert evaluation.timing["mode"] == "no_model_call" and evaluation.evaluated_tokens == 0
    assert (
        scored.prompt
        == render_decision(tiny_engine.template, STATE, ask(1).question, ("option number 0",)).text
    )


# -- through the server (SmolLM2; the app in this process) -----------------------------------------


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[AppServer]:
    proxy = AppServer(model_path, {"SEMIF_CHAT": "off"}).start()
    yield proxy
    proxy.stop()


def options(n: int) -> list[dict[str, str]]:
    teams = ["account_access", "billing", "shipping", "returns", "technical"]
    return [
        {"id": teams[i] if i < len(teams) else f"team_{i}", "description": f"queue {i}"}
        for i in range(n)
    ]


def test_decisions_take_1_to_255_options(server: ProxyProcess) -> None:
    decision = {"id": "t", "state": STATE, "question": "Which queue handles this ticket?"}
    wide = server.call("POST", "/v1/decisions", {"decision": {**decision, "options": options(60)}})
    assert wide.status == 200, wide.body
    result = wide.json()["result"]
    assert result["readout"] == SEQUENCE_READOUT and result["prompt_version"] == "semif-number-v1"
    assert len(result["probabilities"]) == 60 == len(result["first_token_logits"])
    assert sum(result["probabilities"]) == pytest.approx(1.0, abs=1e-9)
    one = server.call("POST", "/v1/decisions", {"decision": {**decision, "options": options(1)}})
    assert one.status == 200 and one.json()["result"]["probabilities"] == [1.0]
    assert one.json()["result"]["readout"] == SINGLE_OPTION
    few = server.call("POST", "/v1/decisions", {"decision": {**decision, "options": options(3)}})
    assert few.json()["result"]["readout"] == "letter-logits"
    assert few.json()["result"]["prompt_version"] == "semif-letter-v1"
    over = server.call("POST", "/v1/decisions", {"decision": {**decision, "options": options(256)}})
    assert over.status == 413
    assert over.json()["error"]["field"] == "decision.options"
    assert over.json()["error"]["message"] == (
        "decision.options: 256 options, over the limit of 255 (SEMIF_MAX_OPTIONS)"
    )


def test_system_one_choices_take_1_to_255_options(server: ProxyProcess) -> None:
    def ask_choice(n: int):
        criteria = {o["id"]: o["description"] for o in options(n)}
        body = {
            "model": "jev-latest",
            "state": STATE,
            "questions": {"queue": {"type": "choice", "criteria": criteria}},
        }
        return server.call("POST", "/v1/systemone", body)

    one = ask_choice(1)
    assert one.status == 200, one.body
    answer = one.json()["answers"]["queue"]
    assert answer["choice"] == "account_access" and answer["probabilities"] == {
        "account_access": 1.0
    }
    assert answer["readout"] == "single-option" and answer["prompt_version"] is None
    wide = ask_choice(100).json()
    assert wide["answers"]["queue"]["readout"] == SEQUENCE_READOUT
    assert len(wide["answers"]["queue"]["probabilities"]) == 100
    assert wide["semif"]["prompt_version"] == "semif-number-v1"
    too_many = ask_choice(256)
    assert too_many.status == 413
    assert "questions.queue.criteria: 256 criteria, over the limit of 255 (SEMIF_MAX_OPTIONS)" in (
        too_many.body.decode()
    )


def test_numbered_score_levels_carry_no_second_number() -> None:
    """Lettered level descriptions start "level 0: ..."; numbered ones carry the text alone: a
    "level 0" next to the label "1" would give the model two numbers for one option."""
    criteria = [f"{k} units of damage" for k in range(30)]
    wide = build_spec("s", ScoreQuestion(type="score", criteria=criteria))
    assert wide.descriptions == tuple(criteria) and wide.option_ids[0] == "0"
    assert wide.legend is not None and wide.legend["29"] == criteria[29]
    few = ScoreQuestion(type="score", criteria=criteria[:3])
    assert build_spec("s", few).descriptions[0] == "level 0: 0 units of damage"
    assert build_spec("s", few, "numbers").descriptions == tuple(criteria[:3])
    labels = labels_for(len(wide.descriptions))
    rendered = render_decision(ChatTemplate(None), STATE, "?", wide.descriptions, labels).text
    assert '{"number": "1", "description": "0 units of damage"}' in rendered
    assert "level 0" not in rendered


def test_the_option_limit_is_a_setting(tiny_model: Path, start_app: StartApp) -> None:
    server = start_app(tiny_model, {"SEMIF_CHAT": "off", "SEMIF_MAX_OPTIONS": "10"})
    decision = {"id": "t", "state": "s", "question": "q?", "options": options(11)}
    over = server.call("POST", "/v1/decisions", {"decisions": [decision]})
    assert over.status == 413
    assert over.json()["error"]["field"] == "decisions[0].options"
    assert "over the limit of 10 (SEMIF_MAX_OPTIONS)" in over.json()["error"]["message"]
    fits = server.call("POST", "/v1/decisions", {"decision": {**decision, "options": options(10)}})
    assert fits.status == 200
    with pytest.raises(SettingsError, match="SEMIF_MAX_OPTIONS"):
        load_settings({"SEMIF_MAX_OPTIONS": "256", "SEMIF_CHAT": "off"}, model=str(tiny_model))


def test_a_tokenizer_that_merges_numbers_into_the_prompt_refuses_them() -> None:
    # A toy tokenizer, one token per character, that glues a newline to the digit after it:
    # "prompt + 12" then does not tokenize as the prompt's tokens + the label's.
    def tokenize(text: str) -> list[int]:
        out: list[int] = []
        for ch in text:
            if ch.isdigit() and out and out[-1] == ord("\n"):
                out[-1] = 1000 + int(ch)
            else:
                out.append(ord(ch))
        return out

    check = check_numbers(tokenize, tokenize, "prompt\n", "<end>", eos=7)
    assert check.reason and "'1'" in check.reason
    clean = check_numbers(tokenize, tokenize, "prompt: ", "<end>", eos=7)
    assert clean.reason is None and clean.tokens[11] == (ord("1"), ord("2"))
    assert clean.end == ord("<")  # the first token of what the template writes after an answer


def test_numbers_the_model_cannot_score_are_a_400_naming_the_options(
    tiny_engine: DecisionEngine,
) -> None:
    healthy = tiny_engine.numbers
    tiny_engine.numbers = replace(healthy, reason="prompt + '1' merges")
    try:
        with pytest.raises(InvalidRequest) as refused:
            tiny_engine.evaluate([ask(27)])
        assert refused.value.field == "decision.options"
        assert "prompt + '1' merges" in refused.value.message
        assert tiny_engine.evaluate([ask(26)]).scored[0].readout == "letter-logits"
    finally:
        tiny_engine.numbers = healthy

"""The deliberate readout (issue #35) on the real SmolLM2 model: the model's greedy reasoning
(Engine.generate), then the option letters read after a fixed answer cue. The letters are held
to a one-piece evaluation of the whole text computed here from the raw native engine (every
vocabulary logit read out), not from the readout code; the budget, the end of turn, the state
the engine keeps, an abort, and the API's fields and errors."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.api import systemone
from semif_proxy.api.decisions import decide, evaluate, parse_request
from semif_proxy.api.schemas import Decision, Option
from semif_proxy.engine import native
from semif_proxy.engine.prompt import render_decision
from semif_proxy.engine.readout_prompts import DELIBERATE_LABELS
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest, PayloadTooLarge
from tests.conftest import GPU_LAYERS
from tests.helpers.one_piece import one_piece

TOL = 0 if GPU_LAYERS == 0 else 1e-3  # GPU kernels are not bit-exact
STATE = "Customer email: the password reset email never arrives and I cannot log in."
OPTIONS = [("billing", "billing"), ("access", "login"), ("shipping", "shipping")]
CUE = "\nSo the answer is ("  # the answer cue, as docs/method.md states it


def decision(id_: str = "d", state: str = STATE, **fields) -> Decision:
    fields = {"readout": "deliberate", **fields}
    opts = [Option(id=i, description=d) for i, d in OPTIONS]
    return Decision(
        id=id_, state=state, question="Which queue?", options=opts, return_prompt=True, **fields
    )


def letter_ids(engine: DecisionEngine, n: int) -> list[int]:
    out = []
    for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n]:
        [token] = engine.core.tokenize(letter, False, False)
        out.append(token)
    return out


def plain_prompt(engine: DecisionEngine, question: str = "Which queue?") -> str:
    descriptions = [d for _, d in OPTIONS]
    return render_decision(engine.template, STATE, question, descriptions, DELIBERATE_LABELS).text


def end_of_turn(engine: DecisionEngine) -> int:
    [token] = engine.core.tokenize("<|im_end|>", False, True)  # SmolLM2's ChatML
    return token


def test_deliberate_letters_equal_the_whole_texts_one_piece_evaluation(
    decision_engine: DecisionEngine,
) -> None:
    asked = [
        decision("long", deliberation_tokens=12, return_reasoning=True),
        decision("short", deliberation_tokens=5, return_reasoning=True).model_copy(
            update={"question": "Which team should take it?"}
        ),
    ]
    results, timing = decide(decision_engine, asked, ["decisions[0]", "decisions[1]"])
    assert timing["mode"] == "shared_prefix"  # each read a branch after the state's prefix
    assert timing["generated_tokens"] == sum(r["deliberation"]["tokens"] for r in results)
    ids = letter_ids(decision_engine, len(OPTIONS))
    for r, question in zip(results, ["Which queue?", "Which team should take it?"]):
        assert r["readout"] == "deliberate-letter-logits"
        assert r["prompt_version"] == "semif-deliberate-v1"
        made = r["deliberation"]
        assert 0 < made["tokens"] <= (12 if r["id"] == "long" else 5)
        # The text read: the prompt as rendered, the model's reasoning, the cue.
        assert r["prompt"] == plain_prompt(decision_engine, question) + made["text"] + CUE
        assert "Think it through briefly" in r["prompt"]
        row, lse = one_piece(decision_engine, decision_engine.tokenize_prompt(r["prompt"]))
        np.testing.assert_allclose(r["option_logits"], row[ids], atol=TOL, rtol=0)
        z = row[ids]
        expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(r["probabilities"], expected, atol=1e-9)
        assert r["allowed_token_mass"] == pytest.approx(np.exp(z - lse).sum(), abs=1e-6)
        assert r["input_tokens"] == len(decision_engine.tokenize_prompt(r["prompt"]))
    # Greedy: the first token is the argmax of the prompt's own one-piece row.
    prompt = decision_engine.tokenize_prompt(plain_prompt(decision_engine))
    first = int(np.argmax(one_piece(decision_engine, prompt)[0]))
    tokens, _, _ = decision_engine.core.generate(prompt, 1, [])
    assert list(tokens) == [first]
    # Asked again after other work, the same reasoning and the same numbers.
    [again], _ = decide(decision_engine, [asked[1]], ["decision"])
    assert again["deliberation"] == results[1]["deliberation"]
    assert again["option_logits"] == results[1]["option_logits"]


def test_option_orders_share_the_state_and_reason_as_their_one_piece_prompts(
    decision_engine: DecisionEngine,
) -> None:
    """A question asked in every option order (permutations): each order's reasoning comes
    after the state's prefix evaluated once, and is token for token what the order's whole
    prompt, evaluated in one piece from a cleared engine, makes the model write."""
    core = decision_engine.core
    descriptions = [d for _, d in OPTIONS]
    orders = [descriptions[k:] + descriptions[:k] for k in range(len(descriptions))]
    rendered = [
        render_decision(decision_engine.template, STATE, "Which queue?", o, DELIBERATE_LABELS)
        for o in orders
    ]
    prompts = [decision_engine.tokenize_prompt(r.text) for r in rendered]
    state = decision_engine.tokenize_prompt(rendered[0].state_prefix)
    prefix, _ = decision_engine.split(state, prompts)
    held = len(prefix)
    assert held > 0 and held % core.cell_align == 0
    budget = 24
    reference = []
    for p in prompts:
        core.reset()
        reference.append(list(core.generate(p, budget, [])[0]))
    core.reset()
    start = core.tokens_evaluated
    made = [core.generate(p, budget, [], held) for p in prompts]
    assert [list(tokens) for tokens, _, _ in made] == reference
    # The prefix once (fresh, then held), each order's rest, each generated token but a
    # budget's last (nothing reads what follows it).
    assert [stats["prefix_reused"] for _, _, stats in made] == [0, held, held]
    decoded = sum(len(t) - (stop == -1 and len(t) > 0) for t, stop, _ in made)
    assert core.tokens_evaluated - start == held + sum(len(p) - held for p in prompts) + decoded
    assert list(core.prefix_tokens) == prompts[0][:held]  # held for the next question on it
    # Through the engine's own path, from a cleared engine and prefix cache: each order's
    # reasoning as above; the state's prefix evaluated once, kept for the letters read, and the
    # tokens reported are the ones the engine evaluated. Asked again it reuses the held prefix;
    # after a reset it restores it from the prefix cache: the same reasoning every time.
    texts = [b"".join(core.token_piece(t) for t in r).decode("utf-8", "ignore") for r in reference]
    finals = [decision_engine.tokenize_prompt(r.text + t + CUE) for r, t in zip(rendered, texts)]
    cold = held + sum(len(p) - held for p in prompts) + decoded
    cold += sum(len(f) - held for f in finals)  # the read, after the prefix still held
    rotated = decision("rotated", deliberation_tokens=budget).model_copy(update={"permutations": 3})
    core.reset()
    decision_engine.cache.clear()
    for again, (reused, hit) in enumerate([(0, False), (held, False), (held, True)]):
        if again == 2:
            core.reset()  # the engine forgot it; the prefix cache holds it
        start = core.tokens_evaluated
        _, evaluation = evaluate(decision_engine, [rotated], ["decision"])
        assert [s.deliberation.text for s in evaluation.scored] == texts
        assert evaluation.evaluated_tokens == core.tokens_evaluated - start
        assert evaluation.evaluated_tokens == cold - (held if again else 0)
        assert evaluation.timing["prefix_reused_tokens"] == reused
        assert evaluation.timing["prefix_cache_hit"] is hit
    # Off the cell grid, or the whole prompt held: refused before any work.
    for wrong in (1, len(prompts[0])):
        with pytest.raises(native.LlamaError) as err:
            core.generate(prompts[0], 1, [], wrong)
        assert err.value.code == native.ERR_BAD_ARGUMENT


def test_the_budget_and_the_end_of_turn_end_the_reasoning(
    decision_engine: DecisionEngine,
) -> None:
    core = decision_engine.core
    prompt = decision_engine.tokenize_prompt(plain_prompt(decision_engine))
    for budget in (1, 3, 8):
        tokens, stop, stats = core.generate(prompt, budget, [end_of_turn(decision_engine)])
        assert len(tokens) <= budget
        assert stop == -1 if len(tokens) == budget else stop >= 0
        assert stats["suffix_tokens"] == max(0, len(tokens) - (stop == -1))
    assert core.generate(prompt, 0, [])[0] == []
    # A question the model answers in a word: its end of turn ends it, well within the budget.
    chat = "<|im_start|>user\nWhat is the capital of France? One word.<|im_end|>\n"
    chat += "<|im_start|>assistant\n"
    tokens, stop, _ = core.generate(decision_engine.tokenize_prompt(chat), 64, [])
    assert 0 < len(tokens) < 64 and stop == end_of_turn(decision_engine)
    # A stop id ends it too, and is not part of the text.
    first = tokens[0]
    cut, stop, _ = core.generate(decision_engine.tokenize_prompt(chat), 64, [first])
    assert list(cut) == [] and stop == first
    # Through the API: at most deliberation_tokens, the text only when asked.
    [short], _ = decide(decision_engine, [decision(deliberation_tokens=2)], ["decision"])
    assert short["deliberation"]["tokens"] <= 2 and "text" not in short["deliberation"]
    assert short["deliberation"]["ended"] in ("budget", "end_of_turn")


def test_the_engine_is_left_as_letters_expect_it(decision_engine: DecisionEngine) -> None:
    letters = decision("letters", readout="letters")
    [before], _ = decide(decision_engine, [letters], ["decision"])
    decide(decision_engine, [decision(deliberation_tokens=6)], ["decision"])
    [after], _ = decide(decision_engine, [letters], ["decision"])
    assert after["option_logits"] == before["option_logits"]
    assert after["probabilities"] == before["probabilities"]
    # Sequence 0 holds the prompt alone afterwards, with its own one-piece logits.
    prompt = decision_engine.tokenize_prompt(plain_prompt(decision_engine))
    row, _ = one_piece(decision_engine, prompt)
    decision_engine.core.generate(prompt, 6, [])
    assert list(decision_engine.core.prefix_tokens) == prompt
    held = decision_engine.core.get_prefix_logits().astype(np.float64)
    np.testing.assert_array_equal(held, row)


def test_an_abort_stops_the_generation(decision_engine: DecisionEngine) -> None:
    core = decision_engine.core
    story = "<|im_start|>user\nWrite a very long story about a dragon.<|im_end|>\n"
    prompt = decision_engine.tokenize_prompt(story + "<|im_start|>assistant\n")
    core.reset()
    start = core.tokens_evaluated
    failure: list[BaseException] = []

    def generate() -> None:
        try:
            core.generate(prompt, 3000, [])
        except BaseException as exc:  # handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=generate)
    worker.start()
    deadline = time.monotonic() + 60
    while core.tokens_evaluated < start + len(prompt) + 3 and worker.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert worker.is_alive(), "the story ended before it could be aborted"
    core.abort()
    worker.join(30)
    try:
        assert not worker.is_alive()
        assert failure and isinstance(failure[0], native.LlamaError)
        assert failure[0].code == native.ERR_ABORTED
        assert core.tokens_evaluated - start < len(prompt) + 3000
        assert list(core.prefix_tokens) == []  # an aborted call leaves no prefix held
    finally:
        core.clear_abort()
    [answered], _ = decide(decision_engine, [decision(deliberation_tokens=2)], ["decision"])
    assert answered["readout"] == "deliberate-letter-logits"


def test_the_prompt_limit_counts_the_budget(
    decision_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = len(decision_engine.tokenize_prompt(plain_prompt(decision_engine)))
    limited = decision_engine.settings.model_copy(update={"max_prompt_tokens": plain + 8})
    monkeypatch.setattr(decision_engine, "settings", limited)
    with pytest.raises(PayloadTooLarge) as err:
        decide(decision_engine, [decision(deliberation_tokens=16)], ["decision"])
    assert err.value.field == "decision" and err.value.extra["limit"] == plain + 8
    assert "deliberation_tokens" in err.value.message
    [fits], _ = decide(decision_engine, [decision(deliberation_tokens=1)], ["decision"])
    assert fits["deliberation"]["tokens"] <= 1


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"readout": "letters", "deliberation_tokens": 8}, "deliberation_tokens", "only"),
        ({"readout": "continuation", "return_reasoning": True}, "return_reasoning", "only"),
        ({"deliberation_tokens": 0}, "deliberation_tokens", "greater than or equal to 1"),
        ({"deliberation_tokens": 2.5}, "deliberation_tokens", "integer"),
        ({"deliberation_tokens": "8"}, "deliberation_tokens", "integer"),
        ({"readout": "thinking"}, "readout", "'deliberate'"),
    ],
)
def test_bad_deliberation_fields_name_the_field(fields: dict, field: str, words: str) -> None:
    body = {"decision": {**decision().model_dump(exclude_defaults=True), **fields}}
    with pytest.raises(InvalidRequest) as err:
        parse_request(body)
    assert err.value.field == f"decision.{field}" and words in err.value.message


def test_engine_refusals_name_the_field(decision_engine: DecisionEngine) -> None:
    most = decision_engine.settings.max_deliberation_tokens
    with pytest.raises(InvalidRequest) as err:
        decide(decision_engine, [decision(deliberation_tokens=most + 1)], ["decision"])
    assert err.value.field == "decision.deliberation_tokens"
    assert str(most) in err.value.message and "SEMIF_MAX_DELIBERATION_TOKENS" in err.value.message


def test_a_contextual_correction_divides_out_a_content_free_deliberation(
    decision_engine: DecisionEngine,
) -> None:
    """deliberate + contextual: the letters after the model's reasoning on the evidence, divided
    by the letters after its reasoning on the content-free state ("N/A") with the same budget,
    each of which is asked here as a plain deliberate decision of its own."""
    decision_engine.content_free._held.clear()
    [plain], _ = decide(decision_engine, [decision(deliberation_tokens=6)], ["decision"])
    [free], _ = decide(
        decision_engine, [decision(state="N/A", deliberation_tokens=6)], ["decision"]
    )
    [fixed], timing = decide(
        decision_engine,
        [decision(deliberation_tokens=6, bias_correction="contextual", return_reasoning=True)],
        ["decision"],
    )
    assert fixed["readout"] == "deliberate-letter-logits"
    assert fixed["bias_correction"] == "contextual"
    assert fixed["option_logits"] == plain["option_logits"]
    assert fixed["content_free_logits"] == free["option_logits"]
    expected = np.asarray(plain["probabilities"]) / np.asarray(free["probabilities"])
    np.testing.assert_allclose(fixed["probabilities"], expected / expected.sum(), atol=1e-12)
    # The answer reports its own reasoning; the content-free one's tokens count in the timing.
    assert fixed["deliberation"]["tokens"] == plain["deliberation"]["tokens"]
    assert "text" in fixed["deliberation"]
    assert timing["generated_tokens"] == (
        plain["deliberation"]["tokens"] + free["deliberation"]["tokens"]
    )
    # Kept per option set and budget: the same budget again deliberates on N/A no more; another
    # budget is another content-free answer.
    before = decision_engine.content_free.hits
    [again], timing = decide(
        decision_engine,
        [decision(deliberation_tokens=6, bias_correction="contextual")],
        ["decision"],
    )
    assert decision_engine.content_free.hits > before
    assert timing["generated_tokens"] == plain["deliberation"]["tokens"]
    assert again["probabilities"] == fixed["probabilities"]
    held = len(decision_engine.content_free)
    [other], _ = decide(
        decision_engine,
        [decision(deliberation_tokens=2, bias_correction="contextual")],
        ["decision"],
    )
    [free2], _ = decide(
        decision_engine, [decision(state="N/A", deliberation_tokens=2)], ["decision"]
    )
    assert len(decision_engine.content_free) == held + 1
    assert other["content_free_logits"] == free2["option_logits"]


def test_a_system_one_question_deliberates(decision_engine: DecisionEngine) -> None:
    settings, sha = decision_engine.settings, decision_engine.sha256
    body = {
        "model": "jev-latest",
        "state": STATE,
        "questions": {
            "queue": {"type": "choice", "criteria": {"billing": None, "login": None},
                      "readout": "deliberate", "deliberation_tokens": 4,
                      "return_reasoning": True},
            "login": {"type": "noul", "instructions": "Is this a login problem?",
                      "readout": "deliberate", "deliberation_tokens": 3,
                      "bias_correction": "contextual"},
            "urgency": {"type": "score", "criteria": ["not", "somewhat", "very"]},
        },
    }  # fmt: skip
    out = systemone.answer(decision_engine, systemone.plan(body, settings, sha), strict=False)
    answers = out["answers"]
    for qid in ("queue", "login"):
        assert answers[qid]["readout"] == "deliberate-letter-logits"
        assert answers[qid]["prompt_version"] == "semif-deliberate-v1"
    assert 0 < answers["queue"]["deliberation"]["tokens"] <= 4
    assert "text" in answers["queue"]["deliberation"]
    assert "text" not in answers["login"]["deliberation"]
    assert 0 < answers["login"]["noul"] < 1
    assert answers["login"]["bias_correction"] == "contextual"
    assert "content_free_logits" in out["semif"]["questions"]["login"]
    assert "bias_correction" not in answers["queue"]
    assert answers["urgency"]["readout"] == "letter-logits"
    assert "deliberation" not in answers["urgency"]
    made = answers["queue"]["deliberation"]["tokens"] + answers["login"]["deliberation"]["tokens"]
    assert out["usage"]["output_tokens"] == made
    strict = systemone.answer(decision_engine, systemone.plan(body, settings, sha), strict=True)
    assert "deliberation" not in strict["answers"]["queue"]


def test_usage_counts_the_tokens_generated_not_the_budget(decision_engine: DecisionEngine) -> None:
    """A question the model answers in a few words: its reasoning ends (end of turn) the same
    way under any budget above that, so the tokens evaluated, System One's usage, are the same;
    they used to count the whole budget. A budget that is used up counts what it generated."""
    settings, sha = decision_engine.settings, decision_engine.sha256

    def ask(state: str, question: str, budget: int) -> dict:
        q = {"type": "noul", "instructions": question, "readout": "deliberate",
             "deliberation_tokens": budget}  # fmt: skip
        body = {"model": "jev-latest", "state": state, "questions": {"q": q}}
        return systemone.answer(decision_engine, systemone.plan(body, settings, sha), strict=False)

    paris = ("Paris is the capital of France.", "Is Paris the capital of France?")
    small, large = ask(*paris, 32), ask(*paris, 256)
    made = small["answers"]["q"]["deliberation"]
    assert made["ended"] == "end_of_turn" and made["tokens"] < 32
    assert large["answers"]["q"]["deliberation"] == made
    assert large["usage"] == small["usage"]
    sky = ("The sky is blue.", "Is the sky blue?")
    short, longer = ask(*sky, 8), ask(*sky, 16)
    assert short["answers"]["q"]["deliberation"] == {"tokens": 8, "ended": "budget"}
    assert longer["answers"]["q"]["deliberation"] == {"tokens": 16, "ended": "budget"}
    # 8 more tokens generated after the same prompt, and read again in the answer's prompt.
    assert 12 <= longer["usage"]["input_tokens"] - short["usage"]["input_tokens"] <= 20


def test_http_fields_limits_and_errors(model_path: Path, start_app) -> None:
    server = start_app(model_path, {"SEMIF_MAX_DELIBERATION_TOKENS": "6"})
    body = decision(return_reasoning=True).model_dump(exclude_defaults=True)
    reply = server.call("POST", "/v1/decisions", {"decision": body}, timeout=120)
    assert reply.status == 200, reply.body
    result = reply.json()["result"]
    assert result["readout"] == "deliberate-letter-logits"
    # The default budget, at most the setting.
    assert 0 < result["deliberation"]["tokens"] <= 6 and "text" in result["deliberation"]
    assert sum(result["probabilities"]) == pytest.approx(1.0)
    for fields, status, field in [
        ({"deliberation_tokens": 7}, 400, "decision.deliberation_tokens"),
        ({"readout": "letters", "deliberation_tokens": 2}, 400, "decision.deliberation_tokens"),
        ({"deliberation_tokens": "two"}, 400, "decision.deliberation_tokens"),
    ]:
        bad = server.call("POST", "/v1/decisions", {"decision": {**body, **fields}})
        assert bad.status == status, bad.body
        error = bad.json()["error"]
        assert error["field"] == field
        if fields.get("deliberation_tokens") == 7:
            assert "6" in error["message"] and "SEMIF_MAX_DELIBERATION_TOKENS" in error["message"]
    one = {"model": "jev-latest", "state": STATE, "questions": {"q": {
        "type": "noul", "readout": "deliberate", "deliberation_tokens": 9}}}  # fmt: skip
    bad = server.call("POST", "/v1/systemone", one)
    assert bad.status == 422, bad.body
    assert bad.json()["detail"][0]["loc"] == ["body", "questions", "q", "deliberation_tokens"]
    one["questions"]["q"]["deliberation_tokens"] = 2
    good = server.call("POST", "/v1/systemone", one, timeout=120)
    assert good.status == 200, good.body
    assert good.json()["answers"]["q"]["deliberation"]["tokens"] <= 2

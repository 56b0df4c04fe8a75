"""Readouts other than letters (issue #35) on the real SmolLM2 model: continuation (sum, mean,
pmi), direct yes/no and score levels, contextual bias correction; each against a reference
computed here from the raw native engine (one-piece evaluations, every vocabulary logit read
out), not from the readout code. A continuation's reference is prompt + option evaluated whole
with the rows at the option's positions read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from semif_proxy.api import systemone
from semif_proxy.api.decisions import decide, parse_request, rotated_questions
from semif_proxy.api.schemas import Decision, Option
from semif_proxy.engine.readout_prompts import CONTINUATION_PROMPT, render
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest, SchemaError
from tests.conftest import GPU_LAYERS
from tests.helpers.one_piece import one_piece, one_piece_rows

TOL = 0 if GPU_LAYERS == 0 else 1e-3  # GPU kernels are not bit-exact
STATE = "Customer email: the password reset email never arrives and I cannot log in."
OPTIONS = [("billing", "billing"), ("access", "login"), ("shipping", "shipping")]


def decision(id_: str = "d", state: str = STATE, options=None, **fields) -> Decision:
    opts = [Option(id=i, description=d) for i, d in (options or OPTIONS)]
    return Decision(
        id=id_, state=state, question="Which queue?", options=opts, return_prompt=True, **fields
    )


def log_softmax(row: np.ndarray) -> np.ndarray:
    top = row.max()
    return row - (top + np.log(np.exp(row - top).sum()))


def continuation_reference(
    engine: DecisionEngine, prompt: str, text: str
) -> tuple[float, float, int]:
    """An option's summed log-probability as the answer: prompt + option (its last token left
    off) evaluated whole, the engine's own logit and logsumexp at each of the option's
    positions summed in order (what the readout must equal bit for bit), the same from a numpy
    log-softmax, and its token count."""
    base = engine.tokenize_prompt(prompt)
    joined = engine.tokenize_prompt(prompt + text)
    assert joined[: len(base)] == base
    n = len(joined) - len(base)
    rows, lses = one_piece_rows(engine, joined[:-1], n)
    exact, numpy_sum = 0.0, 0.0
    for k in range(n):
        token = joined[len(base) + k]
        exact += float(np.float32(rows[k][token])) - lses[k]
        numpy_sum += float(log_softmax(rows[k])[token])
    return exact, numpy_sum, n


# Options of a token or two, and options of many tokens that begin alike (each option's rows
# come from its own evaluation).
LONG = [
    ("billing", "the billing team, for invoices and refunds"),
    ("access", "the account team, for log-in and password problems"),
    ("access2", "the account team, for closing an account"),
]


@pytest.mark.parametrize(
    ("state", "options"),
    [
        (STATE, OPTIONS),
        ("Order 1182: " + "the parcel is late. " * 6, OPTIONS),
        (STATE, LONG),
    ],
)
def test_continuation_equals_its_one_piece_evaluation(
    decision_engine: DecisionEngine, state: str, options: list
) -> None:
    asked = [
        decision("sum", state, options, readout="continuation", normalization="sum"),
        decision("mean", state, options, readout="continuation", normalization="mean").model_copy(
            update={"question": "Which team should take it?"}
        ),
        decision("pmi", state, options, readout="continuation", normalization="pmi"),
        # pmi has taken the content-free answer off already: a contextual correction on top
        # leaves it as it is (what lets the benchmark reuse pmi's rows for it).
        decision(
            "pmi+contextual", state, options, readout="continuation", normalization="pmi",
            bias_correction="contextual",
        ),
    ]  # fmt: skip
    results, timing = decide(decision_engine, asked, [f"decisions[{i}]" for i in range(4)])
    *results, corrected = results
    assert corrected["bias_correction"] == "contextual"
    assert timing["mode"] == "shared_prefix"
    by_id = {r["id"]: r for r in results}
    prompt = by_id["sum"]["prompt"]
    free = render(
        decision_engine.template,
        CONTINUATION_PROMPT,
        "N/A",
        "Which queue?",
        [d for _, d in options],
    ).text
    refs = [continuation_reference(decision_engine, prompt, d) for _, d in options]
    free_refs = [continuation_reference(decision_engine, free, d) for _, d in options]
    sums = np.asarray([r[0] for r in refs])
    np.testing.assert_allclose(by_id["sum"]["option_logits"], sums, atol=TOL, rtol=0)
    np.testing.assert_allclose(
        by_id["sum"]["option_logits"], [r[1] for r in refs], atol=TOL + 1e-9, rtol=0
    )
    # Another question on the same state: its own prompt, its own contexts.
    other = [
        continuation_reference(decision_engine, by_id["mean"]["prompt"], d) for _, d in options
    ]
    means = np.asarray([r[0] / r[2] for r in other])
    np.testing.assert_allclose(by_id["mean"]["option_logits"], means, atol=TOL, rtol=0)
    assert not np.allclose(means, sums / np.asarray([r[2] for r in refs]))
    pmi = sums - np.asarray([r[0] for r in free_refs])
    np.testing.assert_allclose(by_id["pmi"]["option_logits"], pmi, atol=2 * TOL, rtol=0)
    assert corrected["probabilities"] == by_id["pmi"]["probabilities"]
    for r in results:
        assert r["readout"] == "continuation-logprobs"
        assert r["prompt_version"] == "semif-continuation-v2"
        assert r["normalization"] == r["id"]
        assert sum(r["probabilities"]) == pytest.approx(1.0, abs=1e-12)
        logits = np.asarray(r["option_logits"])
        expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(r["probabilities"], expected, atol=1e-12)


def yes_no_reference(engine: DecisionEngine, prompt: str) -> tuple[float, float]:
    """log P(yes), log P(no) after the prompt: every single-token spelling's probability,
    summed, from a numpy log-softmax of the one-piece row."""
    logprobs = log_softmax(one_piece(engine, engine.tokenize_prompt(prompt))[0])
    out = []
    for word in ("yes", "no"):
        ids = set()
        for spelling in (word, word.capitalize(), word.upper()):
            for form in (spelling, " " + spelling):
                tokens = engine.core.tokenize(form, False, False)
                if len(tokens) == 1:
                    ids.add(tokens[0])
        assert ids, word
        out.append(float(np.logaddexp.reduce(logprobs[sorted(ids)])))
    return out[0], out[1]


def test_direct_yes_no_reads_the_models_yes_and_no(decision_engine: DecisionEngine) -> None:
    options = [("no", "something else"), ("yes", "the customer cannot log in")]
    asked = [
        decision("direct", options=options, readout="direct"),
        decision("letters", options=options),
    ]
    results, _ = decide(decision_engine, asked, ["decisions[0]", "decisions[1]"])
    direct, letters = results
    assert direct["readout"] == "direct-yes-no" and letters["readout"] == "letter-logits"
    assert direct["prompt_version"] == "semif-direct-yesno-v1"
    assert "Answer with only yes or no" in direct["prompt"]
    log_yes, log_no = yes_no_reference(decision_engine, direct["prompt"])
    # Option order: "no" first here; the answer words go with their options.
    np.testing.assert_allclose(direct["option_logits"], [log_no, log_yes], atol=TOL + 1e-9)
    p_yes = np.exp(log_yes) / (np.exp(log_yes) + np.exp(log_no))
    assert direct["probabilities"][1] == pytest.approx(p_yes, abs=TOL + 1e-9)
    assert direct["allowed_token_mass"] == pytest.approx(np.exp(log_yes) + np.exp(log_no))


def test_direct_rotations_move_the_answer_words_with_their_options(
    decision_engine: DecisionEngine,
) -> None:
    options = [("yes", "the customer cannot log in"), ("no", "something else")]
    [both], _ = decide(
        decision_engine,
        [decision(options=options, readout="direct", permutations=2)],
        ["decision"],
    )
    assert both["readout"] == "direct-yes-no, mean of 2 rotations"
    asked = rotated_questions(
        decision_engine, [decision(options=options, readout="direct", permutations=2)], ["d"]
    )[0]
    assert [q.answers for q in asked.questions] == [("yes", "no"), ("no", "yes")]
    assert [q.descriptions[0] for q in asked.questions] == [options[0][1], options[1][1]]


def test_contextual_correction_divides_out_the_content_free_answer(
    decision_engine: DecisionEngine,
) -> None:
    decision_engine.content_free._held.clear()
    plain, free = decide(
        decision_engine,
        [decision("plain"), decision("free", state="N/A")],
        ["decisions[0]", "decisions[1]"],
    )[0]
    [fixed], _ = decide(decision_engine, [decision(bias_correction="contextual")], ["decision"])
    assert fixed["readout"] == "letter-logits" and fixed["bias_correction"] == "contextual"
    assert fixed["option_logits"] == plain["option_logits"]
    assert fixed["content_free_logits"] == free["option_logits"]
    expected = np.asarray(plain["probabilities"]) / np.asarray(free["probabilities"])
    np.testing.assert_allclose(fixed["probabilities"], expected / expected.sum(), atol=1e-12)
    # The content-free answer is kept per option set: asked again, it is not evaluated again.
    request = parse_request({"decision": decision(bias_correction="contextual").model_dump()})
    before = decision_engine.content_free.hits
    [again], _ = decide(decision_engine, request.decisions, request.paths)
    assert decision_engine.content_free.hits > before
    assert again["probabilities"] == fixed["probabilities"]
    # The content-free state's answer, corrected by itself, is uniform.
    [same], _ = decide(
        decision_engine, [decision(state="N/A", bias_correction="contextual")], ["decision"]
    )
    np.testing.assert_allclose(same["probabilities"], [1 / 3] * 3, atol=1e-12)


def test_letters_stay_the_default(decision_engine: DecisionEngine) -> None:
    [default], _ = decide(decision_engine, [decision()], ["decision"])
    [explicit], _ = decide(decision_engine, [decision(readout="letters")], ["decision"])
    assert default["readout"] == "letter-logits" and default["prompt_version"] == "semif-letter-v1"
    assert "normalization" not in default and "bias_correction" not in default
    for key in ("option_logits", "probabilities", "prompt_sha256"):
        assert default[key] == explicit[key]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"readout": "logits"}, "decision.readout", "'letters', 'continuation', 'direct'"),
        ({"readout": "direct"}, "decision.readout", "yes/no and score"),
        ({"normalization": "sum"}, "decision.normalization", "continuation only"),
        ({"readout": "continuation", "normalization": "max"}, "decision.normalization", "'pmi'"),
        ({"bias_correction": "platt"}, "decision.bias_correction", "'batch'"),
    ],
)
def test_bad_readout_fields_name_the_field(fields: dict, field: str, words: str) -> None:
    body = {"decision": {**decision().model_dump(exclude_defaults=True), **fields}}
    with pytest.raises(InvalidRequest) as err:
        parse_request(body)
    assert err.value.field == field and words in err.value.message


def test_system_one_questions_take_a_readout(decision_engine: DecisionEngine) -> None:
    settings, sha = decision_engine.settings, decision_engine.sha256
    body = {
        "model": "jev-latest",
        "state": STATE,
        "questions": {
            "login": {"type": "noul", "instructions": "Is this a login problem?",
                      "readout": "direct"},
            "urgency": {"type": "score", "instructions": "How urgent is it?",
                        "criteria": ["not", "somewhat", "very"], "readout": "direct",
                        "bias_correction": "contextual"},
            "queue": {"type": "choice", "criteria": {"billing": None, "login": None},
                      "readout": "continuation", "normalization": "pmi"},
        },
    }  # fmt: skip
    out = systemone.answer(decision_engine, systemone.plan(body, settings, sha), strict=False)
    answers = out["answers"]
    assert answers["login"]["readout"] == "direct-yes-no"
    assert 0 < answers["login"]["noul"] < 1
    assert answers["urgency"]["readout"] == "direct-levels"
    assert answers["urgency"]["prompt_version"] == "semif-direct-levels-v1"
    assert answers["urgency"]["bias_correction"] == "contextual"
    assert sum(answers["urgency"]["probabilities"].values()) == pytest.approx(1.0)
    assert answers["queue"]["readout"] == "continuation-logprobs"
    assert answers["queue"]["normalization"] == "pmi"
    assert "content_free_logits" in out["semif"]["questions"]["urgency"]
    queue = {"type": "choice", "criteria": {"billing": None, "login": None}, "readout": "direct"}
    bad = {**body, "questions": {"queue": queue}}
    with pytest.raises(SchemaError) as err:
        systemone.plan(bad, settings, sha)
    assert err.value.detail[0]["loc"] == ["body", "questions", "queue", "readout"]


def test_http_decisions_echo_their_readout(model_path: Path, start_proxy) -> None:
    server = start_proxy(model_path, preset="decisions")
    yes_no = [{"id": "yes", "description": "a login problem"}, {"id": "no", "description": "other"}]
    for readout, options, name in [
        ("letters", None, "letter-logits"),
        ("continuation", None, "continuation-logprobs"),
        ("direct", yes_no, "direct-yes-no"),
    ]:
        body = decision(readout=readout).model_dump(exclude_defaults=True)
        if options:
            body["options"] = options
        reply = server.call("POST", "/v1/decisions", {"decision": body}, timeout=120)
        assert reply.status == 200, reply.body
        result = reply.json()["result"]
        assert result["readout"] == name and result["prompt_version"]
        assert sum(result["probabilities"]) == pytest.approx(1.0)
    bad = server.call(
        "POST", "/v1/decisions", {"decision": {**decision().model_dump(), "readout": "logits"}}
    )
    assert bad.status == 400
    assert bad.json()["error"]["field"] == "decision.readout"

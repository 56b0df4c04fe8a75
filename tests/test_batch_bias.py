"""Batch calibration (`bias_correction: "batch"`, issue #35; Zhou et al. 2024): the mean answer
over a batch of questions that list the same options divided out of each one's probabilities,
on the real engine and SmolLM2. Each reference is computed here from the same questions
answered uncorrected: p_i / mean_j p_j, renormalised, per option set and option order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semif_proxy.api.decisions import decide
from semif_proxy.api.schemas import Decision, Option
from semif_proxy.engine import batch_bias
from semif_proxy.engine.questions import Question, Scored
from semif_proxy.engine.worker import DecisionEngine
from semif_proxy.errors import InvalidRequest
from tests.helpers.app_server import AppServer

OPTIONS = [("billing", "billing"), ("access", "login"), ("shipping", "shipping")]
STATES = [
    "Customer email: the password reset email never arrives and I cannot log in.",
    "Customer email: I was charged twice for one order.",
    "Customer email: the parcel is a week late.",
]


def decision(id_: str, state: str, question: str = "Which queue?", **fields: Any) -> Decision:
    opts = [Option(id=i, description=d) for i, d in OPTIONS]
    return Decision(id=id_, state=state, question=question, options=opts, **fields)


def reference(plain: list[list[float]]) -> np.ndarray:
    """Batch calibration by its definition: each row divided by the rows' mean, renormalised."""
    p = np.asarray(plain, np.float64)
    ratio = p / p.mean(axis=0)
    return ratio / ratio.sum(axis=1, keepdims=True)


def paths(n: int) -> list[str]:
    return [f"decisions[{i}]" for i in range(n)]


def test_a_batch_divides_out_its_mean_answer(decision_engine: DecisionEngine) -> None:
    plain, _ = decide(
        decision_engine, [decision(f"d{i}", s) for i, s in enumerate(STATES)], paths(3)
    )
    asked = [decision(f"d{i}", s, bias_correction="batch") for i, s in enumerate(STATES)]
    fixed, _ = decide(decision_engine, asked, paths(3))
    expected = reference([r["probabilities"] for r in plain])
    for got, was, want in zip(fixed, plain, expected):
        np.testing.assert_allclose(got["probabilities"], want, rtol=0, atol=1e-12)
        assert got["option_logits"] == was["option_logits"]  # the raw numbers stay as read
        assert got["bias_correction"] == "batch" and got["batch"]["size"] == 3
        np.testing.assert_allclose(
            got["batch"]["mean_probabilities"],
            np.mean([r["probabilities"] for r in plain], axis=0),
            rtol=0,
            atol=1e-15,
        )
    # The batch had a bias to remove: some option was likelier than 1/3 on average.
    assert max(fixed[0]["batch"]["mean_probabilities"]) > 0.34
    # The same question asked twice of one state is one prompt: its mean is its own answer,
    # which divided out would leave a uniform one. Refused.
    twice = [decision(f"t{i}", STATES[0], bias_correction="batch") for i in range(2)]
    with pytest.raises(InvalidRequest, match="2 different states"):
        decide(decision_engine, twice, paths(2))


def test_each_option_set_is_its_own_batch(decision_engine: DecisionEngine) -> None:
    """Two questions in one request: each is calibrated over the decisions that ask it (and a
    decision that asks for no correction is answered as it would be alone)."""
    questions = ["Which queue?", "Which team should take it?"]
    mixed = [(q, s) for q in questions for s in STATES[:2]]
    plain, _ = decide(
        decision_engine, [decision(f"d{i}", s, q) for i, (q, s) in enumerate(mixed)], paths(4)
    )
    asked = [decision(f"d{i}", s, q, bias_correction="batch") for i, (q, s) in enumerate(mixed)]
    alone = decision("x", STATES[2])
    fixed, _ = decide(decision_engine, [*asked, alone], paths(5))
    for group in ([0, 1], [2, 3]):
        want = reference([plain[i]["probabilities"] for i in group])
        for i, row in zip(group, want):
            np.testing.assert_allclose(fixed[i]["probabilities"], row, rtol=0, atol=1e-12)
            assert fixed[i]["batch"]["size"] == 2
    [single], _ = decide(decision_engine, [alone], ["decision"])
    assert fixed[4]["probabilities"] == single["probabilities"] and "batch" not in fixed[4]


def test_every_rotation_is_calibrated_with_the_same_rotation(
    decision_engine: DecisionEngine,
) -> None:
    """permutations: each listed order is a batch of its own (a position bias is the order's),
    and the answer is the mean of the calibrated rotations in the request's order."""
    asked = [
        decision(f"d{i}", s, bias_correction="batch", permutations=3) for i, s in enumerate(STATES)
    ]
    fixed, _ = decide(decision_engine, asked, paths(3))
    orders = fixed[0]["rotations"]["orders"]
    assert len(orders) == 3
    per_rotation = []
    for order in orders:  # each rotation asked uncorrected, as its own listed order
        listed = [Option(id=OPTIONS[j][0], description=OPTIONS[j][1]) for j in order]
        plain, _ = decide(
            decision_engine,
            [
                decision(f"d{i}", s).model_copy(update={"options": listed})
                for i, s in enumerate(STATES)
            ],
            paths(3),
        )
        corrected = reference([r["probabilities"] for r in plain])
        back = np.zeros_like(corrected)
        back[:, order] = corrected  # listed position k holds option order[k]
        per_rotation.append(back)
    want = np.mean(per_rotation, axis=0)
    for got, row in zip(fixed, want):
        np.testing.assert_allclose(got["probabilities"], row, rtol=0, atol=1e-9)


def test_a_decision_alone_in_its_batch_is_refused_before_any_work(
    decision_engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def evaluated(*_: Any) -> None:
        raise AssertionError("the engine was asked")

    monkeypatch.setattr(decision_engine, "evaluate_checked", evaluated)
    asked = [
        decision("a", STATES[0], bias_correction="batch"),
        decision("b", STATES[1], bias_correction="batch"),
        decision("c", STATES[2], "Which team?", bias_correction="batch"),
    ]
    with pytest.raises(InvalidRequest) as err:
        decide(decision_engine, asked, paths(3))
    assert err.value.field == "decisions[2].bias_correction"
    assert "at least 2" in err.value.message and "no other" in err.value.message
    with pytest.raises(InvalidRequest, match=r"decision\.bias_correction: batch"):
        decide(decision_engine, [asked[0]], ["decision"])
    # The same options in another order, or other permutations, are another batch.
    turned = asked[1].model_copy(update={"options": list(reversed(asked[1].options))})
    with pytest.raises(InvalidRequest, match=r"decisions\[0\]\.bias_correction"):
        decide(decision_engine, [asked[0], turned], paths(2))


def test_only_questions_read_alike_share_a_batch() -> None:
    q = Question("d", "d", "s1", "q", ("a", "b"), bias_correction="batch")
    other = [
        Question("d", "d", "s2", "q", ("a", "b"), bias_correction="batch", temperature=2.0),
        Question(
            "d", "d", "s2", "q", ("a", "b"), bias_correction="batch", log_position_prior=(0.0, -1.0)
        ),
        Question("d", "d", "s2", "q", ("b", "a"), bias_correction="batch"),
        Question("d", "d", {"s": 2}, "q", ("a", "b"), bias_correction="batch", readout="direct"),
    ]
    for o in other:
        assert batch_bias.alone([q, o]) == [q, o]
    assert batch_bias.alone([q, replace(q, state={"s": 2})]) == []


def test_an_option_no_question_of_the_batch_gives_any_probability_keeps_none() -> None:
    q = Question("d", "d", "s", "q", ("a", "b", "c"), bias_correction="batch")
    rows = [
        Scored(replace(q, state=f"s{i}"), np.zeros(3), np.array(p), 1.0, 1, "")
        for i, p in enumerate(([0.5, 0.5, 0.0], [0.2, 0.8, 0.0]))
    ]
    fixed = batch_bias.corrected(rows)
    for row in fixed:
        assert np.isfinite(row.probabilities).all() and row.probabilities[2] == 0.0
        assert row.probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    # mean (0.35, 0.65): 0.5/0.35 : 0.5/0.65, renormalised
    assert fixed[0].probabilities[0] == pytest.approx((0.5 / 0.35) / (0.5 / 0.35 + 0.5 / 0.65))


# -- over HTTP: a System One batch, JSON Lines ---------------------------------------------------

NOUL = {"type": "noul", "instructions": "Is the customer asking for money back?"}
TONE = {
    "type": "choice",
    "instructions": "What is the tone?",
    "criteria": {"angry": None, "calm": None},
}


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[AppServer]:
    app = AppServer(model_path, {"SEMIF_CHAT": "off", "SEMIF_REQUEST_TIMEOUT": "240"}).start()
    yield app
    app.stop()


def system_one_batch(states: list[str], correction: str) -> dict[str, Any]:
    return {
        "model": "jev-latest",
        "states": states,
        "questions": {"refund": {**NOUL, "bias_correction": correction}, "tone": TONE},
    }


def test_a_system_one_batch_is_calibrated_over_its_states(server: AppServer) -> None:
    plain = server.call(
        "POST", "/v1/systemone/batch", system_one_batch(STATES, "none"), timeout=240
    )
    fixed = server.call(
        "POST", "/v1/systemone/batch", system_one_batch(STATES, "batch"), timeout=240
    )
    assert plain.status == 200 and fixed.status == 200, fixed.body
    yes = [a["refund"]["noul"] for a in plain.json()["answers"]]
    want = reference([[p, 1 - p] for p in yes])[:, 0]
    got = [a["refund"]["noul"] for a in fixed.json()["answers"]]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    for a, b in zip(plain.json()["answers"], fixed.json()["answers"]):
        assert a["tone"] == b["tone"]  # asked for no correction: as before
        assert b["refund"]["bias_correction"] == "batch"
    block = fixed.json()["semif"]["states"][0]["questions"]["refund"]["batch"]
    assert block["size"] == 3

    for states in (STATES[:1], [STATES[0], STATES[0]]):  # one state, or one state twice
        one = server.call("POST", "/v1/systemone/batch", system_one_batch(states, "batch"))
        assert one.status == 422
        [detail] = one.json()["detail"]
        assert detail["loc"] == ["body", "questions", "refund", "bias_correction"]
        assert "send different states" in detail["msg"]
    single = {
        "model": "jev-latest",
        "state": STATES[0],
        "questions": {"refund": {**NOUL, "bias_correction": "batch"}},
    }
    alone = server.call("POST", "/v1/systemone", single)
    assert alone.status == 422 and "/v1/systemone/batch" in alone.json()["detail"][0]["msg"]


def jsonlines_call(server: AppServer, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = "\n".join(json.dumps(line) for line in lines).encode()
    reply = server.call(
        "POST",
        "/invocations",
        raw=body,
        headers={"Content-Type": "application/jsonlines"},
        timeout=240,
    )
    assert reply.status == 200, reply.body
    return [json.loads(line) for line in reply.body.decode().splitlines()]


def test_a_json_lines_body_is_one_batch(server: AppServer) -> None:
    """The lines of one body are the batch (Batch Transform: MultiRecord); a line whose question
    no other line asks gets its own error line, and its neighbours are answered."""

    def line(state: str, correction: str) -> dict[str, Any]:
        return {"decision": decision("d", state, bias_correction=correction).model_dump()}

    plain = jsonlines_call(server, [line(s, "none") for s in STATES])
    lone = {
        "model": "jev-latest",
        "state": STATES[0],
        "questions": {"refund": {**NOUL, "bias_correction": "batch"}},
    }
    got = jsonlines_call(
        server, [line(STATES[0], "batch"), lone, *[line(s, "batch") for s in STATES[1:]]]
    )
    want = reference([p["result"]["probabilities"] for p in plain])
    for answer, row in zip([got[0], got[2], got[3]], want):
        np.testing.assert_allclose(answer["result"]["probabilities"], row, rtol=0, atol=1e-12)
        assert answer["result"]["batch"]["size"] == 3
    assert got[1]["status"] == 422 and got[1]["line"] == 2
    assert got[1]["detail"][0]["loc"] == ["body", "questions", "refund", "bias_correction"]
    assert "lines of this body" in got[1]["detail"][0]["msg"]


def test_eval_reports_a_batch_row_as_one_it_cannot_ask(tmp_path: Path) -> None:
    """eval asks each row alone: a row asking for a batch correction is a bad row, said why,
    not a run of refused requests."""
    from semif_proxy.eval.rows import read_rows

    rows = tmp_path / "rows.jsonl"
    noul = {"state": STATES[0], "question": {**NOUL, "bias_correction": "batch"}, "expected": "yes"}
    plain = {"state": STATES[0], "question": NOUL, "expected": "yes"}
    tagged = decision("d", STATES[1], bias_correction="batch").model_dump()
    lines = [noul, plain, {"decision": tagged, "expected": "billing"}]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    good, bad = read_rows(rows)
    assert [r.line for r in good] == [2]
    assert [b.line for b in bad] == [1, 3]
    assert all("eval asks each row alone" in b.error for b in bad)


def test_a_decisions_request_has_one_state_so_no_batch(server: AppServer) -> None:
    """A request's decisions share one state: a batch of them would be one prompt's answer
    divided by itself. Refused, pointing at the way that works."""
    asked = [decision(f"d{i}", STATES[0], bias_correction="batch").model_dump() for i in range(3)]
    reply = server.call("POST", "/v1/decisions", {"decisions": asked})
    error = reply.json()["error"]
    assert reply.status == 400 and error["field"] == "decisions[0].bias_correction"
    assert "JSON Lines" in error["message"]


def test_json_lines_of_one_state_are_no_batch(server: AppServer) -> None:
    line = {"decision": decision("d", STATES[0], bias_correction="batch").model_dump()}
    got = jsonlines_call(server, [line, line])
    assert [g["status"] for g in got] == [400, 400]
    assert all(g["error"]["field"] == "decision.bias_correction" for g in got)

"""The position prior (PriDe): fitted from rotated, unlabelled rows; written by `semif-proxy
calibrate --rows`; read with the temperatures (SEMIF_CALIBRATION, or SEMIF_TEMPERATURE as
before); divided out of the answers of a server (the app in this process, real engine and
SmolLM2), which says so in each answer; and the rows log that server writes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import typesafe_sdk as ts

from semif_proxy.api import rows_log
from semif_proxy.api.rotations import rotations
from semif_proxy.calibration import position_prior
from semif_proxy.cli import main
from semif_proxy.engine.examples import ROUTING_OPTIONS, ROUTING_STATE
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess, wait_for
from tests.helpers.app_server import AppServer

PLANTED = np.array([0.55, 0.2, 0.15, 0.1])


def rotated_logits(prior: np.ndarray, content: np.ndarray, rng: np.random.Generator, noise: float):
    """The model PriDe assumes: position j's logit in order r is log prior_j + the content of
    the option listed there + a constant of that order (+ noise)."""
    n = len(prior)
    orders = rotations(n, n)
    logits = np.array(
        [
            np.log(prior) + content[order] + rng.normal(0.0, 7.0) + rng.normal(0.0, noise, n)
            for order in orders
        ]
    )
    return orders, logits


def synthetic_rows(
    kind: str, prior: np.ndarray, count: int, seed: int, noise: float = 0.0
) -> list[position_prior.RotatedRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        orders, logits = rotated_logits(prior, rng.normal(0.0, 2.0, len(prior)), rng, noise)
        rows.append(position_prior.RotatedRow(kind, orders, logits))
    return rows


def naive_position_mean(rows: list[position_prior.RotatedRow]) -> np.ndarray:
    """A wrong estimate: the mean probability of each position over every order (no logs)."""
    probs = [np.exp(r.logits - np.logaddexp.reduce(r.logits, axis=1, keepdims=True)) for r in rows]
    return np.mean([p.mean(axis=0) for p in probs], axis=0)


def first_order_only(rows: list[position_prior.RotatedRow]) -> np.ndarray:
    """A wrong estimate: the mean answer of the request's own order alone (content included)."""
    first = np.array([r.logits[0] for r in rows])
    return np.mean(np.exp(first - np.logaddexp.reduce(first, axis=1, keepdims=True)), axis=0)


# -- fitting ----------------------------------------------------------------------------------


def test_fit_recovers_a_planted_prior_exactly_without_noise() -> None:
    rows = synthetic_rows("choice", PLANTED, 40, seed=1)
    fitted = position_prior.fit(rows)
    assert fitted.prior.tables["choice"][4] == pytest.approx(PLANTED, abs=1e-9)
    assert fitted.prior.tables["default"][4] == pytest.approx(PLANTED, abs=1e-9)
    # The content is strong here (sd 2 per option): estimates that do not cancel it miss.
    assert np.abs(naive_position_mean(rows) - PLANTED).max() > 0.05
    assert np.abs(first_order_only(rows) - PLANTED).max() > 0.05


def test_fit_recovers_a_planted_prior_through_noise_per_type() -> None:
    noul = np.array([0.8, 0.2])
    rows = synthetic_rows("choice", PLANTED, 300, seed=2, noise=0.5)
    rows += synthetic_rows("noul", noul, 300, seed=3, noise=0.5)
    rows += synthetic_rows("score", np.array([0.1, 0.2, 0.3, 0.4]), 3, seed=4)  # too few
    fitted = position_prior.fit(rows, min_questions=5)
    tables = fitted.prior.tables
    assert np.asarray(tables["choice"][4]) == pytest.approx(PLANTED, abs=0.02)
    assert np.asarray(tables["noul"][2]) == pytest.approx(noul, abs=0.02)
    assert "score" not in tables and fitted.report["too_few"] == {"score/4": 3}
    # The pooled table at 4 options mixes choice and the 3 score rows.
    assert 4 in tables["default"] and 2 in tables["default"]
    # A type without a table of its own falls back to the pooled one; no table: no prior.
    log_score = fitted.prior.log_prior("score", 4)
    assert log_score == pytest.approx(np.log(tables["default"][4]))
    assert fitted.prior.log_prior("choice", 3) is None
    t = fitted.report["tables"]["choice/4"]
    assert t["first_listed_before"] > 0.4 and abs(t["first_listed_after"] - 0.25) < 0.1


def test_rows_not_asked_in_every_rotation_are_skipped() -> None:
    rng = np.random.default_rng(5)
    good = synthetic_rows("choice", PLANTED, 6, seed=6)
    two_of_four = position_prior.RotatedRow("choice", rotations(4, 2), rng.normal(size=(2, 4)))
    one = position_prior.RotatedRow("choice", [[0, 1, 2, 3]], rng.normal(size=(1, 4)))
    fitted = position_prior.fit([*good, two_of_four, one])
    assert (fitted.report["balanced_rows"], fitted.report["skipped_rows"]) == (6, 2)
    assert fitted.prior.tables["choice"][4] == pytest.approx(PLANTED, abs=1e-9)
    # Any Latin set of orders balances positions, not only cyclic rotations.
    assert position_prior.balanced([[0, 1, 2], [2, 0, 1], [1, 2, 0]], 3)
    assert not position_prior.balanced([[0, 1, 2], [1, 0, 2]], 3)
    assert not position_prior.balanced([[0, 0, 1], [1, 1, 0]], 3)


def test_applying_the_prior_moves_a_position_biased_answer() -> None:
    """A reader that mostly takes the first-listed option: with its prior divided out, the
    answer follows the content."""
    prior = position_prior.from_json({"choice": {"4": [0.85, 0.05, 0.05, 0.05]}})
    content = np.array([0.0, 1.5, 0.2, -0.3])  # the second option is the right one
    logits = np.log([0.85, 0.05, 0.05, 0.05]) + content
    assert int(np.argmax(logits)) == 0
    debiased = logits - np.asarray(prior.log_prior("choice", 4))
    assert int(np.argmax(debiased)) == 1
    assert debiased - debiased.max() == pytest.approx(content - content.max(), abs=1e-12)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"choise": {"2": [1, 1]}}, "unknown question type"),
        ({"choice": {"3": [0.5, 0.5]}}, r"position_prior\.choice\.3: 2 values for 3 positions"),
        ({"noul": {"2": [1.0, 0.0]}}, "positive"),
        ({"noul": {"1": [1.0]}}, "at least 2"),
        ([0.5, 0.5], "must be an object"),
    ],
)
def test_bad_priors_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        position_prior.from_json(value)


# -- the calibration file ----------------------------------------------------------------------


def row_line(
    kind: str,
    orders: list[list[int]],
    logits: np.ndarray,
    model: str = "m",
    prompt_version: str | None = None,
) -> dict:
    line = {"type": kind, "model": model, "orders": orders, "option_logits": logits.tolist()}
    if prompt_version is not None:
        line["prompt_version"] = prompt_version
    return line


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_calibrate_rows_writes_the_prior_the_settings_read(
    tmp_path: Path, model_path: Path
) -> None:
    rows = synthetic_rows("choice", PLANTED, 60, seed=7, noise=0.3)
    path = write_lines(
        tmp_path / "rows.jsonl", [row_line(r.kind, r.orders, r.logits) for r in rows]
    )
    out = tmp_path / "calibration.json"
    assert main(["calibrate", "--rows", str(path), "--output", str(out)]) == 0
    written = json.loads(out.read_text())
    assert np.asarray(written["position_prior"]["choice"]["4"]) == pytest.approx(PLANTED, abs=0.03)
    assert written["temperature"] == {"default": 1.0}
    assert written["position_prior_fit"]["balanced_rows"] == 60
    for var in ("SEMIF_CALIBRATION", "SEMIF_TEMPERATURE"):  # the old name reads the file too
        settings = load_settings({var: str(out)}, model=str(model_path))
        log_prior = settings.position_prior.log_prior("choice", 4)
        assert np.exp(log_prior) == pytest.approx(written["position_prior"]["choice"]["4"])
        assert settings.position_prior.log_prior("noul", 2) is None


def test_calibrate_fits_the_temperature_on_debiased_logits(tmp_path: Path) -> None:
    """Labels drawn from softmax((logits - log prior) / 1.7): with the prior from the rows, the
    fitted temperature is the one the labels were drawn at."""
    rows = synthetic_rows("choice", PLANTED, 60, seed=8)
    rows_file = write_lines(
        tmp_path / "rows.jsonl", [row_line(r.kind, r.orders, r.logits) for r in rows]
    )
    rng = np.random.default_rng(9)
    predictions = []
    for _ in range(3000):
        content = rng.normal(0.0, 3.0, 4)
        logits = np.log(PLANTED) + content
        p = np.exp(content / 1.7 - (content / 1.7).max())
        label = int(rng.choice(4, p=p / p.sum()))
        predictions.append({"type": "choice", "option_logits": logits.tolist(), "label": label})
    pred_file = write_lines(tmp_path / "p.jsonl", predictions)
    out = tmp_path / "c.json"
    args = ["calibrate", "--rows", str(rows_file), "--predictions", str(pred_file)]
    assert main([*args, "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["temperature"]["choice"] == pytest.approx(1.7, rel=0.08)
    choice = report["types"]["choice"]
    assert choice["position_prior_applied"] == 3000
    assert choice["accuracy_after"] > choice["accuracy"]  # the prior moved answers to content
    assert choice["nll_after"] < choice["nll_before"]
    # Without the rows, the prior is not divided out: another temperature entirely.
    assert main(["calibrate", "--predictions", str(pred_file), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["temperature"]["choice"] != pytest.approx(1.7, rel=0.08)


def test_calibrate_rows_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o.json")
    assert main(["calibrate", "--output", out]) == 2
    assert "--predictions" in capsys.readouterr().err
    rows = synthetic_rows("choice", PLANTED, 3, seed=10)
    mixed = [row_line(r.kind, r.orders, r.logits, model=f"m{i}") for i, r in enumerate(rows)]
    assert (
        main(["calibrate", "--rows", str(write_lines(tmp_path / "m", mixed)), "--output", out]) == 2
    )
    assert "rows of 3 models" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "choice", "orders": [[0, 1]], "option_logits": [[1.0]]}\n')
    assert main(["calibrate", "--rows", str(bad), "--output", out]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    few = write_lines(tmp_path / "few", [row_line(r.kind, r.orders, r.logits) for r in rows])
    assert main(["calibrate", "--rows", str(few), "--output", out]) == 2  # 3 < 5 questions
    assert "no prior fitted" in capsys.readouterr().err
    assert not Path(out).exists()


def test_a_prior_keeps_the_prompt_version_it_was_fitted_on(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Letters and numbers are two prompts with two position biases: rows of both at one option
    count are not fitted together, and a prior fitted on one is refused where the server asks
    that option count with the other (SEMIF_LABELS changed)."""
    rows = synthetic_rows("choice", PLANTED, 10, seed=11)
    lettered = [
        row_line(r.kind, r.orders, r.logits, prompt_version="semif-letter-v1") for r in rows
    ]
    out = tmp_path / "c.json"
    rows_file = write_lines(tmp_path / "rows.jsonl", lettered)
    assert main(["calibrate", "--rows", str(rows_file), "--output", str(out)]) == 0
    written = json.loads(out.read_text())["position_prior"]
    assert written["prompt_versions"] == {"4": "semif-letter-v1"}
    assert position_prior.from_json(written).prompt_versions == {4: "semif-letter-v1"}
    model = str(model_path)
    served = load_settings({"SEMIF_CALIBRATION": str(out)}, model=model)
    assert served.position_prior.log_prior("choice", 4) is not None
    with pytest.raises(SettingsError) as refused:
        load_settings({"SEMIF_CALIBRATION": str(out), "SEMIF_LABELS": "numbers"}, model=model)
    message = str(refused.value)
    assert message.startswith("SEMIF_CALIBRATION: the position prior for 4 options")
    assert "semif-letter-v1" in message and "semif-number-v1" in message
    # Rows of one option count asked both ways: refused, naming both versions.
    numbered = [
        row_line(r.kind, r.orders, r.logits, prompt_version="semif-number-v1") for r in rows
    ]
    both = write_lines(tmp_path / "both.jsonl", lettered + numbered)
    assert main(["calibrate", "--rows", str(both), "--output", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "rows with 4 options were asked with 2 prompt versions" in err
    assert "semif-letter-v1, semif-number-v1" in err
    # Lines from before the log recorded a version: fitted as before, no version kept.
    old = write_lines(tmp_path / "old.jsonl", [row_line(r.kind, r.orders, r.logits) for r in rows])
    assert main(["calibrate", "--rows", str(old), "--output", str(out)]) == 0
    assert "prompt_versions" not in json.loads(out.read_text())["position_prior"]
    bad_count = r"position_prior\.prompt_versions: .*at least 2, got 1"
    with pytest.raises(SettingsError, match=bad_count):
        load_settings(
            {"SEMIF_CALIBRATION": '{"position_prior": {"prompt_versions": {"1": "x"}}}'},
            model=model,
        )


def test_calibration_setting_forms(tmp_path: Path, model_path: Path) -> None:
    model = str(model_path)
    inline = json.dumps(
        {"temperature": {"default": 2.0}, "position_prior": {"noul": {"2": [3, 1]}}}
    )
    s = load_settings({"SEMIF_CALIBRATION": inline}, model=model)
    assert s.temperature.for_type("choice") == 2.0
    assert s.position_prior.log_prior("noul", 2) == pytest.approx((np.log(0.75), np.log(0.25)))
    # SEMIF_TEMPERATURE's old forms: a number, a JSON object of temperatures, a file.
    assert load_settings({"SEMIF_TEMPERATURE": "1.5"}, model=model).temperature.default == 1.5
    t = load_settings({"SEMIF_TEMPERATURE": '{"choice": 0.5}'}, model=model).temperature
    assert (t.for_type("choice"), t.for_type("noul")) == (0.5, 1.0)
    old_file = tmp_path / "t.json"
    old_file.write_text(json.dumps({"temperature": {"score": 3.0}, "types": {}}))
    old = load_settings({"SEMIF_TEMPERATURE": str(old_file)}, model=model)
    assert old.temperature.for_type("score") == 3.0 and old.position_prior.tables == {}
    # Both set: the new name wins.
    both = load_settings({"SEMIF_CALIBRATION": "2.5", "SEMIF_TEMPERATURE": "1.5"}, model=model)
    assert both.temperature.default == 2.5
    with pytest.raises(SettingsError, match=r"SEMIF_CALIBRATION: position_prior\.choice\.3"):
        load_settings(
            {"SEMIF_CALIBRATION": '{"position_prior": {"choice": {"3": [1, 1]}}}'}, model=model
        )
    with pytest.raises(SettingsError, match=r"SEMIF_TEMPERATURE: .*unknown question type"):
        load_settings({"SEMIF_TEMPERATURE": '{"position_prior": {"x": {}}}'}, model=model)
    with pytest.raises(SettingsError, match=r"SEMIF_ROWS_LOG: .*does not exist"):
        load_settings({"SEMIF_ROWS_LOG": str(tmp_path / "no" / "rows.jsonl")}, model=model)


# -- the rows log ------------------------------------------------------------------------------


def test_rows_log_that_cannot_be_written_drops_lines_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = rows_log.RowsLog(tmp_path)  # a folder: every open fails
    with caplog.at_level(logging.ERROR, logger="semif_proxy.rows_log"):
        writer.record([{"a": 1}, {"a": 2}, {"a": 3}])
        assert writer.flush()
    writer.close()
    assert (writer.written, writer.dropped) == (0, 3)
    assert [r.event for r in caplog.records] == ["rows_log_error"]
    good = rows_log.RowsLog(tmp_path / "rows.jsonl")
    good.record([{"a": 1}, {"b": [1.5, 2]}])
    assert good.flush()
    good.close()
    assert [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()] == [
        {"a": 1},
        {"b": [1.5, 2]},
    ]


# -- a server (the app in this process, real engine and SmolLM2) ---------------------------------

DECISION_PRIOR = [0.05, 0.9, 0.05]  # planted: position 1 strongly favoured
CHOICE_PRIOR = [0.6, 0.3, 0.1]
CHOICE_TEMPERATURE = 2.0


@pytest.fixture(scope="module")
def calibrated(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    folder = tmp_path_factory.mktemp("prior")
    calibration = folder / "calibration.json"
    calibration.write_text(
        json.dumps(
            {
                "temperature": {"default": 1.0, "choice": CHOICE_TEMPERATURE},
                "position_prior": {
                    "decision": {"3": DECISION_PRIOR},
                    "choice": {"3": CHOICE_PRIOR},
                },
            }
        )
    )
    env = {
        "SEMIF_CHAT": "off",
        "SEMIF_CALIBRATION": str(calibration),
        "SEMIF_ROWS_LOG": str(folder / "rows.jsonl"),
    }
    server = AppServer(model_path, env).start()
    server.rows_path = folder / "rows.jsonl"
    yield server
    server.stop()


def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(x, dtype=np.float64) / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def routing(decision_id: str, **extra: object) -> dict:
    return {
        "id": decision_id,
        "state": ROUTING_STATE,
        "question": "Which support queue should handle this ticket?",
        "options": [{"id": i, "description": d} for i, d in ROUTING_OPTIONS],
        **extra,
    }


def rows_with_id(server: ProxyProcess, wanted: str, count: int) -> list[dict]:
    def lines() -> list[dict]:
        if not server.rows_path.exists():
            return []
        text = server.rows_path.read_text()
        return [json.loads(x) for x in text.splitlines() if json.loads(x)["id"] == wanted]

    wait_for(lambda: len(lines()) >= count, 30, f"{count} rows log lines for {wanted}")
    return lines()


def test_server_divides_the_prior_out_of_decisions(calibrated: ProxyProcess) -> None:
    assert len(ROUTING_OPTIONS) == 3
    reply = calibrated.call("POST", "/v1/decisions", {"decision": routing("with-prior")})
    assert reply.status == 200, reply.body
    result = reply.json()["result"]
    assert result["position_prior"] == "applied"
    logits = np.asarray(result["option_logits"])  # raw, as without a prior
    expected = softmax(logits - np.log(DECISION_PRIOR))
    assert np.abs(np.asarray(result["probabilities"]) - expected).max() < 1e-9
    off = calibrated.call(
        "POST", "/v1/decisions", {"decision": routing("no-prior", position_prior=False)}
    ).json()["result"]
    assert off["position_prior"] == "none"
    assert off["option_logits"] == result["option_logits"]
    assert np.abs(np.asarray(off["probabilities"]) - softmax(logits)).max() < 1e-9
    # The planted prior favours position 1: dividing it out moves an answer that sat there.
    assert int(np.argmax(off["probabilities"])) == 1
    assert int(np.argmax(result["probabilities"])) != 1
    # No table for 4 options (and no pooled one): no prior, and the answer says so.
    four = routing("four")
    four["options"] = [*four["options"], {"id": "other", "description": "Anything else"}]
    body = calibrated.call("POST", "/v1/decisions", {"decision": four}).json()["result"]
    assert body["position_prior"] == "none"
    assert np.abs(np.asarray(body["probabilities"]) - softmax(body["option_logits"])).max() < 1e-9


def test_server_applies_the_prior_and_temperature_in_system_one(calibrated: ProxyProcess) -> None:
    questions = {
        "queue": {
            "type": "choice",
            "instructions": "Which queue should handle it?",
            "criteria": dict(ROUTING_OPTIONS),
        },
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    }
    body = {"model": "jev-latest", "state": ROUTING_STATE, "questions": questions}
    reply = calibrated.call("POST", "/v1/systemone", body)
    assert reply.status == 200, reply.body
    out = reply.json()
    diag = out["semif"]["questions"]
    assert diag["queue"]["position_prior"] == "applied"
    assert diag["urgent"]["position_prior"] == "none"  # no table for noul
    logits = np.asarray(diag["queue"]["option_logits"][0])
    expected = softmax(logits - np.log(CHOICE_PRIOR), CHOICE_TEMPERATURE)
    got = np.asarray(list(out["answers"]["queue"]["probabilities"].values()))
    assert np.abs(got - expected).max() < 1e-9
    off = calibrated.call("POST", "/v1/systemone", {**body, "position_prior": False}).json()
    assert off["semif"]["questions"]["queue"]["position_prior"] == "none"
    got_off = np.asarray(list(off["answers"]["queue"]["probabilities"].values()))
    assert np.abs(got_off - softmax(logits, CHOICE_TEMPERATURE)).max() < 1e-9
    # The answers stay valid TypeSafe answers: the official client reads them.
    with ts.TypeSafeClient(
        base_url=calibrated.url, api_key="x", retry=ts.RetryPolicy(max_retries=0)
    ) as client:
        response = client.system_one(ROUTING_STATE, questions, model="jev-latest")
    sdk = response.choices["queue"].probabilities
    assert np.abs(np.asarray(list(sdk.values())) - expected).max() < 1e-9


def test_server_writes_rows_that_calibrate_fits(calibrated: ProxyProcess, tmp_path: Path) -> None:
    decision = routing("logged", permutations=3)
    reply = calibrated.call("POST", "/v1/decisions", {"decision": decision}).json()["result"]
    assert reply["position_prior"] == "applied"
    [line] = rows_with_id(calibrated, "logged", 1)
    assert (line["api"], line["type"], line["option_ids"]) == (
        "decisions",
        "decision",
        [i for i, _ in ROUTING_OPTIONS],
    )
    assert line["model"] == reply["model"]["sha256"]
    assert line["orders"] == reply["rotations"]["orders"] == rotations(3, 3)
    assert line["prompt_sha256"] == reply["prompt_sha256"]
    assert line["prompt_version"] == reply["prompt_version"] == "semif-letter-v1"
    # Presented order in the log; the answer reports each rotation in the request's order.
    for order, presented, in_request_order in zip(
        line["orders"], line["option_logits"], reply["rotations"]["option_logits"]
    ):
        assert presented == [in_request_order[i] for i in order]
    state = "Parcel 88 arrived broken and I want my money back."
    body = {
        "model": "jev-latest",
        "state": state,
        "questions": {
            "logged-q": {
                "type": "choice",
                "criteria": {"refund": "money back", "repair": None, "ignore": "nothing"},
            }
        },
        "permutations": 3,
    }
    assert calibrated.call("POST", "/v1/systemone", body).status == 200
    [q_line] = rows_with_id(calibrated, "logged-q", 1)
    assert (q_line["api"], q_line["type"], q_line["option_ids"]) == (
        "systemone",
        "choice",
        ["refund", "repair", "ignore"],
    )
    assert "state" not in q_line and state not in json.dumps(q_line)
    # The log is what `calibrate --rows` reads: these two questions fit a 3-option prior.
    out = tmp_path / "fitted.json"
    args = ["calibrate", "--rows", str(calibrated.rows_path), "--min-questions", "1"]
    assert main([*args, "--output", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["position_prior_fit"]["balanced_rows"] >= 2
    prior = fitted["position_prior"]["default"]["3"]
    assert sum(prior) == pytest.approx(1.0) and all(p > 0 for p in prior)
    # The prompt version the rows were asked with goes into the calibration with the prior.
    assert fitted["position_prior"]["prompt_versions"] == {"3": "semif-letter-v1"}


def test_calibrate_rows_of_other_readouts_are_skipped_not_mixed_in(tmp_path: Path) -> None:
    """A rows log of a server where some questions were read by continuation: the prior is
    fitted from the lettered rows alone (their prior is the one the server applies), and the
    continuation rows, whose option log-scores know no letters, are counted apart."""
    letters = synthetic_rows("choice", PLANTED, 60, seed=11, noise=0.3)
    # Continuation rows of the same option count with the opposite preference: mixed in, they
    # would pull the fitted prior away from the planted one.
    other = synthetic_rows("choice", PLANTED[::-1], 60, seed=12, noise=0.3)
    lines = [
        row_line(r.kind, r.orders, r.logits, prompt_version="semif-letter-v1") for r in letters
    ]
    lines += [
        row_line(r.kind, r.orders, r.logits, prompt_version="semif-continuation-v1") for r in other
    ]
    out = tmp_path / "calibration.json"
    args = ["calibrate", "--rows", str(write_lines(tmp_path / "rows.jsonl", lines))]
    assert main([*args, "--output", str(out)]) == 0
    written = json.loads(out.read_text())
    assert np.asarray(written["position_prior"]["choice"]["4"]) == pytest.approx(PLANTED, abs=0.03)
    assert written["position_prior_fit"]["balanced_rows"] == 60
    assert written["position_prior_fit"]["other_readout_rows"] == 60


def test_the_rows_log_holds_what_a_corrected_answer_was_served_from(
    calibrated: ProxyProcess,
) -> None:
    """A yes/no question is corrected by default (content-free logits divided out): its rows
    log line carries them, and calibration reads the line as the logits served from."""
    from semif_proxy.api.rows_log import parse_row

    body = {
        "model": "jev-latest",
        "state": ROUTING_STATE,
        "questions": {"cf-noul": {"type": "noul", "instructions": "Is it about billing?"}},
    }
    reply = calibrated.call("POST", "/v1/systemone", body)
    assert reply.status == 200, reply.body
    answer = reply.json()["answers"]["cf-noul"]
    assert answer["bias_correction"] == "contextual"
    [line] = rows_with_id(calibrated, "cf-noul", 1)
    assert len(line["content_free_logits"]) == len(line["option_logits"]) == 1
    served = softmax(parse_row(line, "log").logits[0])
    assert sorted(served) == pytest.approx(sorted([answer["noul"], 1 - answer["noul"]]), abs=1e-9)
    raw = softmax(line["option_logits"][0])
    assert sorted(raw) != pytest.approx(sorted(served), abs=1e-3)  # the correction moved it

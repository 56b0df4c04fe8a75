"""Abstention by question type and option count: the buckets, the threshold map and its checks,
thresholds suggested from labelled rows, SEMIF_MIN_CONFIDENCE, and the server (the app in this
process, tiny model) judging each answer by its own bucket's threshold."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typesafe_sdk as ts

from semif_proxy.calibration.abstention import (
    BUCKETS,
    ThresholdError,
    Thresholds,
    bucket,
    suggest_thresholds,
)
from semif_proxy.calibration.temperature import Prediction
from semif_proxy.cli import main
from semif_proxy.settings import SettingsError, load_settings
from semif_proxy.testing.server import ProxyProcess
from tests.helpers.app_server import AppServer

STATE = "Order #4471: I was charged twice for the same order and nobody answers my emails!"


# -- rows with a chosen confidence ------------------------------------------------------------


def logits_at(confidence: float, n: int) -> list[float]:
    """Option logits whose softmax gives option 0 the probability p with (n*p - 1)/(n - 1) =
    confidence, the rest sharing what is left."""
    p = (confidence * (n - 1) + 1.0) / n
    return [math.log(p)] + [math.log((1.0 - p) / (n - 1))] * (n - 1)


def row(kind: str, confidence: float, n: int, right: bool) -> dict[str, Any]:
    return {"type": kind, "option_logits": logits_at(confidence, n), "label": 0 if right else 1}


# 40 rows at confidences 1/41 ... 40/41. The 20 most confident are right; from the 20th down they
# alternate wrong, right, ...; the 10 least confident are wrong. Kept from the top: 20 of 20,
# 20/21, 21/22, 21/23, 22/24 (0.917), 22/25 (0.88), 23/26 (0.885), 23/27, ... never 0.9 again.
# So at 0.9 the smallest threshold keeps 24 rows (down to confidence 17/41), at 0.95 22 rows
# (down to 19/41).
def right_at(i: int) -> bool:
    return i > 20 or (10 < i <= 20 and i % 2 == 1)


PATTERN = [(i / 41, right_at(i)) for i in range(1, 41)]


def predictions(kind: str, n: int, pattern=PATTERN) -> list[Prediction]:
    return [
        Prediction(kind, np.asarray(logits_at(c, n)), 0 if right else 1) for c, right in pattern
    ]


def entry(report: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return next(e for e in report["buckets"] if (e["type"], e["bucket"]) == (kind, name))


# -- pure -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "name"),
    [
        (2, "2"),
        (3, "3-4"),
        (4, "3-4"),
        (5, "5-8"),
        (8, "5-8"),
        (9, "9-16"),
        (16, "9-16"),
        (17, "17-26"),
        (26, "17-26"),
        (27, "27-64"),
        (50, "27-64"),
        (64, "27-64"),
        (65, "65+"),
        (255, "65+"),
    ],
)
def test_option_counts_fall_in_their_bucket(n: int, name: str) -> None:
    assert bucket(n) == name


def test_one_option_goes_with_two() -> None:
    """A one-option question is answered with confidence 1: it passes any threshold."""
    assert bucket(1) == "2"
    assert Thresholds.parse({"choice": {"2": 1.0}}).threshold_for("choice", 1) == 1.0
    with pytest.raises(ValueError, match="at least 1"):
        bucket(0)


def test_the_most_specific_entry_wins() -> None:
    t = Thresholds.parse(
        {
            "choice": {"2": 0.1, "5-8": 0.7, "default": 0.4},
            "score": 0.3,
            "default": {"27-64": 0.9, "default": 0.2},
        }
    )
    assert t.threshold_for("choice", 2) == 0.1
    assert t.threshold_for("choice", 6) == 0.7
    assert t.threshold_for("choice", 3) == 0.4  # the type's default
    assert t.threshold_for("score", 50) == 0.3  # a number for the whole type
    assert t.threshold_for("noul", 2) == 0.2  # the top default's default
    assert t.threshold_for("noul", 2) == 0.2
    assert t.threshold_for("decision", 40) == 0.9  # the top default's bucket
    partial = Thresholds.parse({"choice": {"2": 0.1}})
    assert partial.threshold_for("choice", 5) is None  # nothing applies: not judged
    assert partial.threshold_for("noul", 2) is None
    assert Thresholds.parse(0.25).threshold_for("score", 200) == 0.25


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        (1.5, (), "from 0 to 1"),
        (-0.1, (), "from 0 to 1"),
        (True, (), "a number"),
        ("0.5", (), "a number"),
        ([0.5], (), "a number"),
        ({"chioce": 0.5}, ("chioce",), "unknown question type"),
        ({"choice": {"3-5": 0.2}}, ("choice", "3-5"), "unknown option-count bucket"),
        ({"choice": {"3-4": 2}}, ("choice", "3-4"), "from 0 to 1"),
        ({"choice": {"3-4": None}}, ("choice", "3-4"), "a number"),
        ({"noul": {"5-8": 0.3}}, ("noul", "5-8"), "always has 2 options"),
        ({"score": [0.3]}, ("score",), "map by option count"),
        ({"default": {"default": float("nan")}}, ("default", "default"), "from 0 to 1"),
    ],
)
def test_a_bad_value_names_its_path(value: Any, path: tuple[str, ...], says: str) -> None:
    with pytest.raises(ThresholdError) as err:
        Thresholds.parse(value)
    assert err.value.path == path and says in err.value.message


def test_the_smallest_threshold_that_reaches_the_target() -> None:
    rows = predictions("choice", 4)
    at_90 = suggest_thresholds(rows, 0.9)
    e = entry(at_90, "choice", "3-4")
    assert e["status"] == "ok" and e["rows"] == 40
    assert 16 / 41 < e["threshold"] <= 17 / 41  # keeps rows 17..40 and no lower one
    assert e["kept"] == 24 and e["coverage"] == pytest.approx(0.6)
    assert e["accuracy"] == pytest.approx(22 / 24) and e["accuracy_all"] == pytest.approx(25 / 40)
    assert at_90["min_confidence"] == {"choice": {"3-4": e["threshold"]}}
    at_95 = entry(suggest_thresholds(rows, 0.95), "choice", "3-4")
    assert 18 / 41 < at_95["threshold"] <= 19 / 41 and at_95["kept"] == 22
    assert at_95["accuracy"] == pytest.approx(21 / 22)
    # The suggestion is the threshold the server applies: abstained when confidence < it.
    t = Thresholds.parse(at_90["min_confidence"]).threshold_for("choice", 4)
    assert sum(c >= t for c, _ in PATTERN) == 24


def test_buckets_are_fitted_apart() -> None:
    """The same confidences mean the same thresholds in each bucket, and a bucket's rows do not
    leak into another's: 2-option rows all right keep every row (threshold 0)."""
    all_right = [(c, True) for c, _ in PATTERN]
    rows = predictions("choice", 6) + predictions("choice", 2, all_right)
    report = suggest_thresholds(rows, 0.9)
    assert entry(report, "choice", "2")["threshold"] == 0.0
    assert entry(report, "choice", "2")["coverage"] == 1.0
    assert entry(report, "choice", "5-8")["kept"] == 24


def test_too_few_rows_and_an_unreachable_target() -> None:
    few = predictions("noul", 2, PATTERN[:29])
    wrong = predictions("score", 5, [(c, False) for c, _ in PATTERN])
    report = suggest_thresholds(few + wrong, 0.9)
    short = entry(report, "noul", "2")
    assert short["status"] == "too few rows" and short["needs"] == 30 and short["rows"] == 29
    assert short["threshold"] is None and "noul" not in report["min_confidence"]
    never = entry(report, "score", "5-8")
    assert never["status"] == "unreachable" and never["threshold"] == 1.0 and never["kept"] == 0
    assert report["min_confidence"] == {"score": {"5-8": 1.0}}  # abstain there, do not guess
    with pytest.raises(ValueError, match="target accuracy"):
        suggest_thresholds(few, 1.5)


def test_thresholds_are_on_the_temperatures_confidences() -> None:
    """At T = 2 every confidence is lower but the order of the rows is the same: the same rows
    are kept, under a lower threshold."""
    rows = predictions("choice", 4)
    plain = entry(suggest_thresholds(rows, 0.9), "choice", "3-4")
    warm = entry(suggest_thresholds(rows, 0.9, {"default": 1.0, "choice": 2.0}), "choice", "3-4")
    assert warm["kept"] == plain["kept"] == 24
    assert warm["threshold"] < plain["threshold"] - 0.05


# -- SEMIF_MIN_CONFIDENCE ---------------------------------------------------------------------


def settings_with(value: str, model: Path):
    return load_settings({"SEMIF_CHAT": "off", "SEMIF_MIN_CONFIDENCE": value}, model=str(model))


def test_the_setting_takes_a_number_a_map_or_a_file(tiny_model: Path, tmp_path: Path) -> None:
    assert settings_with("0.4", tiny_model).min_confidence.threshold_for("choice", 9) == 0.4
    mapped = settings_with('{"choice": {"5-8": 0.6}, "default": 0.1}', tiny_model)
    assert mapped.min_confidence.threshold_for("choice", 5) == 0.6
    assert mapped.min_confidence.threshold_for("noul", 2) == 0.1
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"temperature": {"default": 1.0}, "min_confidence": {"noul": 0.3}}))
    from_file = settings_with(str(cal), tiny_model)
    assert from_file.min_confidence.threshold_for("noul", 2) == 0.3
    assert from_file.public_dict()["min_confidence"] == {"noul": 0.3}
    assert load_settings({"SEMIF_CHAT": "off"}, model=str(tiny_model)).min_confidence is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1.5", "from 0 to 1"),
        ('{"choice": {"3-5": 0.2}}', "choice.3-5: unknown option-count bucket"),
        ('{"chioce": 0.2}', "chioce: unknown question type"),
        ("no-such-file.json", "a calibration file"),
        ("TEMPERATURE_ONLY", "has no min_confidence"),
        ("BAD_FILE", "choice.2: must be from 0 to 1"),
    ],
)
def test_a_bad_setting_names_the_variable(
    tiny_model: Path, tmp_path: Path, value: str, says: str
) -> None:
    only_t = tmp_path / "t.json"
    only_t.write_text(json.dumps({"temperature": {"default": 1.2}}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"min_confidence": {"choice": {"2": 7}}}))
    value = {"TEMPERATURE_ONLY": str(only_t), "BAD_FILE": str(bad)}.get(value, value)
    with pytest.raises(SettingsError) as err:
        settings_with(value, tiny_model)
    assert str(err.value).startswith("SEMIF_MIN_CONFIDENCE: ") and says in str(err.value)


# -- the server (the app in this process) -----------------------------------------------------


def labelled_rows() -> list[dict[str, Any]]:
    """noul (2 options) and 5-option choice rows enough for a suggestion, 3-option choice
    rows too few for one."""
    return (
        [row("noul", c, 2, right) for c, right in PATTERN]
        + [row("choice", c, 5, right) for c, right in PATTERN]
        + [row("choice", c, 3, right) for c, right in PATTERN[:10]]
    )


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("abstention")
    pred = folder / "p.jsonl"
    pred.write_text("".join(json.dumps(r) + "\n" for r in labelled_rows()))
    out = folder / "calibration.json"
    args = ["calibrate", "--predictions", str(pred), "--target-accuracy", "0.9"]
    assert main([*args, "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def server(tiny_model: Path, calibration: Path) -> Iterator[AppServer]:
    """The tiny model, with the thresholds `semif-proxy calibrate` wrote as the default."""
    proxy = AppServer(
        tiny_model, {"SEMIF_CHAT": "off", "SEMIF_MIN_CONFIDENCE": str(calibration)}
    ).start()
    yield proxy
    proxy.stop()


QUESTIONS = {
    "yes": {"type": "noul", "instructions": "Is this about billing?"},
    "two": {"type": "choice", "criteria": {"refund": None, "ignore": None}},
    "three": {"type": "choice", "criteria": {"angry": None, "calm": None, "happy": None}},
    "five": {"type": "choice", "criteria": {n: None for n in ("a", "b", "c", "d", "e")}},
}


def ask(server: ProxyProcess, **extra: Any) -> dict[str, Any]:
    body = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS, **extra}
    reply = server.call("POST", "/v1/systemone", body)
    assert reply.status == 200, reply.body[:300]
    return reply.json()["answers"]


def confidence(answer: dict[str, Any]) -> float:
    return answer["confidence"] if "confidence" in answer else abs(2 * answer["noul"] - 1)


def judged(answer: dict[str, Any], threshold: float) -> None:
    """The answer carries the threshold it was judged by and the verdict that threshold gives."""
    assert answer["threshold"] == threshold
    expected = confidence(answer) < threshold
    assert answer["abstained"] is expected
    assert answer["abstention"] == ("abstained" if expected else "passed")


def test_calibrate_writes_thresholds_and_their_table(calibration: Path) -> None:
    report = json.loads(calibration.read_text())
    suggested = report["min_confidence"]
    assert set(suggested) == {"noul", "choice"} and set(suggested["choice"]) == {"5-8"}
    assert 0.0 < suggested["noul"]["2"] < 1.0 and 0.0 < suggested["choice"]["5-8"] < 1.0
    table = {(e["type"], e["bucket"]): e for e in report["abstention"]["buckets"]}
    assert table[("choice", "3-4")]["status"] == "too few rows"
    assert table[("choice", "5-8")]["kept"] == 24  # the pattern's, at the fitted temperature
    assert report["abstention"]["target_accuracy"] == 0.9


def test_the_setting_judges_every_answer_by_its_bucket(
    server: ProxyProcess, calibration: Path
) -> None:
    suggested = json.loads(calibration.read_text())["min_confidence"]
    answers = ask(server)
    judged(answers["yes"], suggested["noul"]["2"])
    judged(answers["five"], suggested["choice"]["5-8"])
    for name in ("two", "three"):  # no threshold for their buckets: not judged
        assert not {"abstained", "abstention", "threshold"} & set(answers[name]), name


def test_the_request_overrides_the_setting(server: ProxyProcess) -> None:
    answers = ask(server, min_confidence=0.0)
    for answer in answers.values():
        judged(answer, 0.0)
        assert answer["abstention"] == "passed"
    answers = ask(server, min_confidence={"noul": 1.0})  # replaces the whole setting
    judged(answers["yes"], 1.0)
    assert answers["yes"]["abstention"] == "abstained"
    assert "threshold" not in answers["five"]


def test_a_map_judges_each_bucket_by_its_own_threshold(server: ProxyProcess) -> None:
    """Thresholds halfway below one answer's confidence and halfway above the other's: the
    2-option choice passes and the 5-option one abstains on the same server, then the other way
    round when the buckets' thresholds are swapped."""
    seen = ask(server, min_confidence=0.0)
    c2, c5 = seen["two"]["confidence"], seen["five"]["confidence"]
    assert 0.0 < c2 < 1.0 and 0.0 < c5 < 1.0
    low2, high5 = c2 / 2, (1.0 + c5) / 2
    answers = ask(server, min_confidence={"choice": {"2": low2, "5-8": high5}})
    assert answers["two"]["abstention"] == "passed" and answers["two"]["threshold"] == low2
    assert answers["five"]["abstention"] == "abstained" and answers["five"]["threshold"] == high5
    assert "threshold" not in answers["three"]  # 3-4: no entry, no default
    high2, low5 = (1.0 + c2) / 2, c5 / 2
    swapped = ask(server, min_confidence={"choice": {"2": high2, "5-8": low5}, "default": 0.0})
    assert swapped["two"]["abstention"] == "abstained" and swapped["two"]["abstained"] is True
    assert swapped["five"]["abstention"] == "passed" and swapped["five"]["abstained"] is False
    judged(swapped["three"], 0.0)  # the top default
    assert swapped["two"]["choice"] == answers["two"]["choice"]  # the answer is kept


def test_batches_and_invocations_apply_it_too(server: ProxyProcess) -> None:
    body = {"model": "jev-latest", "states": [STATE, "Where is my parcel?"]}
    body["questions"] = {"five": QUESTIONS["five"]}
    batch = server.call("POST", "/v1/systemone/batch", dict(body, min_confidence=1.0))
    assert batch.status == 200, batch.body[:300]
    for answers in batch.json()["answers"]:
        judged(answers["five"], 1.0)
    single = {"model": "jev-latest", "state": STATE, "questions": body["questions"]}
    invoked = server.call("POST", "/invocations", dict(single, min_confidence={"choice": 1.0}))
    assert invoked.status == 200, invoked.body[:300]
    judged(invoked.json()["answers"]["five"], 1.0)


@pytest.mark.parametrize(
    ("value", "loc"),
    [
        ({"choice": {"3-5": 0.2}}, ["min_confidence", "choice", "3-5"]),
        ({"choice": {"3-4": 1.5}}, ["min_confidence", "choice", "3-4"]),
        ({"chioce": 0.2}, ["min_confidence", "chioce"]),
        ({"noul": {"9-16": 0.2}}, ["min_confidence", "noul", "9-16"]),
        (2, ["min_confidence"]),
        ("high", ["min_confidence"]),
    ],
)
def test_a_bad_min_confidence_is_a_422_at_its_path(
    server: ProxyProcess, value: Any, loc: list[str]
) -> None:
    single = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}
    batch = {"model": "jev-latest", "states": [STATE], "questions": QUESTIONS}
    for path, body in (("/v1/systemone", single), ("/v1/systemone/batch", batch)):
        reply = server.call("POST", path, dict(body, min_confidence=value))
        assert reply.status == 422, (path, reply.body[:300])
        detail = reply.json()["detail"]
        assert detail[0]["loc"] == ["body", *loc], path
        assert detail[0]["type"] == "value_error" and detail[0]["msg"]


def test_a_calibrate_target_needs_labelled_rows(tmp_path: Path) -> None:
    pred = tmp_path / "p.jsonl"
    pred.write_text(json.dumps(row("noul", 0.5, 2, True)) + "\n")
    out = str(tmp_path / "o.json")
    assert main(["calibrate", "--predictions", str(pred), "--target-accuracy", "1.5"]) == 2
    no_labels = ["calibrate", "--rows", str(pred), "--target-accuracy", "0.9"]
    assert main([*no_labels, "--output", out]) == 2


# -- strict -----------------------------------------------------------------------------------


ABSTENTION_FIELDS = {"abstained", "abstention", "threshold"}


def test_strict_answers_keep_typesafe_fields_unless_asked(tiny_model: Path) -> None:
    """With SEMIF_STRICT the server's own threshold adds nothing to TypeSafe's answer; a request
    that sends min_confidence asks for the fields, and the SDK still reads the answer."""
    strict = AppServer(
        tiny_model, {"SEMIF_CHAT": "off", "SEMIF_STRICT": "1", "SEMIF_MIN_CONFIDENCE": "0.5"}
    ).start()
    try:
        answers = ask(strict)
        for name, answer in answers.items():
            assert not ABSTENTION_FIELDS & set(answer), name
            # Strict: TypeSafe's fields only (the readout and prompt version are ours).
            assert not {"readout", "prompt_version"} & set(answer), name
        asked = ask(strict, min_confidence={"default": 1.0})
        for answer in asked.values():
            judged(answer, 1.0)
        with ts.TypeSafeClient(
            base_url=strict.url, api_key="none", retry=ts.RetryPolicy(max_retries=0)
        ) as client:
            response = client.system_one(
                STATE, QUESTIONS, extra_body={"min_confidence": {"choice": 0.0}}
            )
        assert response.choices["five"].choice in QUESTIONS["five"]["criteria"]
        raw = response.raw_http_response.json()
        assert raw["answers"]["five"]["abstention"] == "passed"
        assert set(raw) == {"model", "answers", "usage"}
    finally:
        strict.stop()


def test_every_bucket_name_is_accepted() -> None:
    value = {"choice": {name: 0.5 for name in (*BUCKETS, "default")}}
    assert Thresholds.parse(value).threshold_for("choice", 100) == 0.5

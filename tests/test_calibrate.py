"""Temperature calibration on synthetic logits with a known temperature."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from semif_proxy.calibration import temperature as calibrate
from semif_proxy.cli import main
from semif_proxy.settings import load_settings


def synthetic(kind: str, temperature: float, n: int, k: int, seed: int) -> list[dict]:
    """Logits whose labels are drawn from softmax(logits / temperature): the temperature that
    minimises the NLL is, in expectation, the true one."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        logits = rng.normal(0.0, 3.0, size=k)
        p = np.exp(logits / temperature - (logits / temperature).max())
        rows.append(
            {
                "type": kind,
                "option_logits": logits.tolist(),
                "label": int(rng.choice(k, p=p / p.sum())),
            }
        )
    return rows


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fit_recovers_known_temperatures(tmp_path: Path) -> None:
    rows = synthetic("choice", 2.5, 4000, 5, 1) + synthetic("noul", 0.6, 4000, 2, 2)
    report = calibrate.calibrate(calibrate.read_predictions(write(tmp_path / "p.jsonl", rows)))
    assert report["types"]["choice"]["temperature"] == pytest.approx(2.5, rel=0.08)
    assert report["types"]["noul"]["temperature"] == pytest.approx(0.6, rel=0.08)
    for r in report["types"].values():
        assert r["nll_after"] <= r["nll_before"]
        assert r["ece_after"] < r["ece_before"]


def test_golden_section_finds_a_convex_minimum() -> None:
    assert calibrate.golden_min(lambda x: (x - 3.7) ** 2, 0.0, 10.0) == pytest.approx(3.7, abs=1e-4)


def reference_nll(rows: list[dict], temperature: float) -> float:
    """Mean negative log-likelihood of the labels, written out here (not calibrate.nll)."""
    total = 0.0
    for r in rows:
        z = np.asarray(r["option_logits"]) / temperature
        total += np.logaddexp.reduce(z) - z[r["label"]]
    return total / len(rows)


def test_cli_fit_recovers_the_temperature_and_lowers_the_nll(
    tmp_path: Path, model_path: Path
) -> None:
    rows = synthetic("score", 1.8, 1500, 4, 3)
    pred = write(tmp_path / "p.jsonl", rows)
    out = tmp_path / "temperature.json"
    assert main(["calibrate", "--predictions", str(pred), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    fitted = report["temperature"]["score"]
    assert fitted == pytest.approx(1.8, rel=0.1)  # the temperature the labels were drawn at
    # The fit is the NLL's minimum: lower than at T = 1 and than a step either side of it.
    assert reference_nll(rows, fitted) < reference_nll(rows, 1.0)
    assert reference_nll(rows, fitted) < reference_nll(rows, fitted * 0.9)
    assert reference_nll(rows, fitted) < reference_nll(rows, fitted * 1.1)
    r = report["types"]["score"]
    assert r["nll_after"] == pytest.approx(reference_nll(rows, fitted), rel=1e-5)
    assert r["nll_before"] == pytest.approx(reference_nll(rows, 1.0), rel=1e-9)
    # The written file is what SEMIF_TEMPERATURE reads.
    settings = load_settings({"SEMIF_TEMPERATURE": str(out)}, model=str(model_path))
    assert settings.temperature.for_type("score") == pytest.approx(fitted)
    assert settings.temperature.for_type("choice") == 1.0


def test_ece_on_a_hand_computed_example() -> None:
    """10 equal-width bins on [0, 1], each [b/10, (b+1)/10), the last one closed ([0.9, 1.0]).
    Bin 0: 0.05 (wrong): |0 - 0.05| = 0.05. Bin 4: 0.45 (right): |1 - 0.45| = 0.55. Bin 5:
    0.5 (right) and 0.55 (wrong): |0.5 - 0.525| = 0.025. Bin 9: 0.95 and 1.0 (both right):
    |1 - 0.975| = 0.025. Weighted by share: (0.05 + 0.55 + 2 x 0.025 + 2 x 0.025) / 6."""
    confidences = [0.05, 0.45, 0.5, 0.55, 0.95, 1.0]
    correct = [False, True, True, False, True, True]
    assert calibrate.ece(confidences, correct) == pytest.approx(0.7 / 6, abs=1e-12)
    # Had 0.5 gone to bin 4 with 0.45 (a (lo, hi] rule), that bin's gap would be |1 - 0.475|
    # and the result (0.05 + 2 x 0.525 + 0.55 + 2 x 0.025) / 6 instead.
    assert calibrate.ece(confidences, correct) != pytest.approx(1.7 / 6)
    assert calibrate.ece([1.0], [True]) == 0.0  # 1.0 is binned (last bin), not dropped
    assert calibrate.ece([], []) == 0.0


def test_expected_with_option_ids_and_bad_rows(tmp_path: Path) -> None:
    row = {"type": "choice", "option_logits": [1.0, 2.0], "option_ids": ["a", "b"], "expected": "b"}
    assert calibrate.parse_prediction(row, "x").label == 1
    with pytest.raises(calibrate.PredictionError, match="label"):
        calibrate.parse_prediction({"option_logits": [1.0, 2.0], "label": 5}, "x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["calibrate", "--predictions", str(bad), "--output", str(tmp_path / "o")]) == 2


def test_a_corrected_answer_is_calibrated_as_served() -> None:
    """A contextually corrected answer (yes/no by default) is served as softmax((z - z_cf)/T):
    a prediction or a rows-log line that carries its content-free logits is fitted on that."""
    from semif_proxy.api.rows_log import RowsError, parse_row
    from semif_proxy.calibration.temperature import PredictionError, parse_prediction

    row = {"type": "noul", "option_logits": [3.0, 1.0], "label": 1}
    assert parse_prediction(row, "l1").logits.tolist() == [3.0, 1.0]
    free = parse_prediction({**row, "content_free_logits": [4.0, 0.5]}, "l1")
    assert free.logits.tolist() == [-1.0, 0.5]
    with pytest.raises(PredictionError, match="content_free_logits"):
        parse_prediction({**row, "content_free_logits": [4.0]}, "l1")

    line = {"type": "noul", "orders": [[0, 1], [1, 0]], "option_logits": [[3.0, 1.0], [2.0, 2.5]]}
    assert np.array_equal(parse_row(line, "l1").logits, [[3.0, 1.0], [2.0, 2.5]])
    line["content_free_logits"] = [[4.0, 0.5], [1.0, 1.0]]
    assert np.array_equal(parse_row(line, "l1").logits, [[-1.0, 0.5], [1.0, 1.5]])
    line["content_free_logits"] = [[4.0, 0.5]]
    with pytest.raises(RowsError, match="content_free_logits"):
        parse_row(line, "l1")

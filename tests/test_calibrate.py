"""Temperature calibration on synthetic logits with a known temperature."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from semif_proxy import calibrate
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


def test_cli_writes_a_file_that_settings_accept(tmp_path: Path, model_path: Path) -> None:
    pred = write(tmp_path / "p.jsonl", synthetic("score", 1.8, 1500, 4, 3))
    out = tmp_path / "temperature.json"
    assert main(["calibrate", "--predictions", str(pred), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    fitted = report["temperature"]["score"]
    settings = load_settings({"SEMIF_TEMPERATURE": str(out)}, model=str(model_path))
    assert settings.temperature.for_type("score") == pytest.approx(fitted)
    assert settings.temperature.for_type("choice") == 1.0
    # Temperature scaling keeps every argmax.
    for row in map(json.loads, pred.read_text().splitlines()[:200]):
        logits = np.asarray(row["option_logits"])
        assert np.argmax(logits / fitted) == np.argmax(logits)


def test_expected_with_option_ids_and_bad_rows(tmp_path: Path) -> None:
    row = {"type": "choice", "option_logits": [1.0, 2.0], "option_ids": ["a", "b"], "expected": "b"}
    assert calibrate.parse_prediction(row, "x").label == 1
    with pytest.raises(calibrate.PredictionError, match="label"):
        calibrate.parse_prediction({"option_logits": [1.0, 2.0], "label": 5}, "x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["calibrate", "--predictions", str(bad), "--output", str(tmp_path / "o")]) == 2

"""SEMIF_CALIBRATION (or SEMIF_TEMPERATURE) as the server reads it: a number (one temperature),
a JSON object of temperatures, or a calibration (`{"temperature": {...}, "position_prior":
{...}}`) inline or in the file `semif-proxy calibrate` writes."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from semif_proxy.calibration.position_prior import PositionPrior
from semif_proxy.calibration.position_prior import from_json as position_prior_from_json


class Temperature(BaseModel):
    """Softmax temperature per question type; `default` applies where no type is named."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    default: float = Field(1.0, gt=0.0, le=100.0)
    decision: float | None = Field(None, gt=0.0, le=100.0)
    noul: float | None = Field(None, gt=0.0, le=100.0)
    choice: float | None = Field(None, gt=0.0, le=100.0)
    score: float | None = Field(None, gt=0.0, le=100.0)

    def for_type(self, kind: str) -> float:
        value = getattr(self, kind, None)
        return float(value) if value is not None else self.default


def parse_calibration(value: str) -> tuple[Temperature, PositionPrior]:
    """SEMIF_CALIBRATION (or SEMIF_TEMPERATURE): a number (one temperature), a JSON object of
    temperatures, or a calibration (`{"temperature": {...}, "position_prior": {...}}`) inline or
    in the file `semif-proxy calibrate` writes."""
    text = value.strip()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        if not Path(text).is_file():
            raise ValueError(
                f"expected a number, a JSON object or a calibration file, got {value!r}"
            ) from exc
        # The file `semif-proxy calibrate` writes.
        try:
            parsed = json.loads(Path(text).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc2:
            raise ValueError(f"calibration file {text!r} is not JSON: {exc2}") from exc2
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        return Temperature(default=float(parsed)), PositionPrior()
    if isinstance(parsed, dict):
        # A calibration file may carry extra keys (ECE, counts, fit reports); only temperatures
        # and position priors are read.
        calibration = "temperature" in parsed or "position_prior" in parsed
        temps = parsed.get("temperature", {}) if calibration else parsed
        prior = parsed.get("position_prior", {}) if calibration else {}
        if isinstance(temps, (int, float)) and not isinstance(temps, bool):
            temps = {"default": temps}
        if isinstance(temps, dict):
            return Temperature(**temps), position_prior_from_json(prior)
    raise ValueError(f"expected a number or a JSON object of temperatures, got {value!r}")

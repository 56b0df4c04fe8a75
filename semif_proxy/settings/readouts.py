"""SEMIF_READOUT: the readout a decision or System One question gets when it names none (issue
#35). One word for every question type ("continuation"), or a JSON object by type as
SEMIF_CALIBRATION's temperatures are given (`{"noul": "direct", "score": "direct"}`; `default`
for the types not named). A request's own `readout` always wins.

`direct` reads yes/no and score answers only, so it may be the default of `noul` and `score`
alone: a server default that refused every other question would be no default."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, model_validator

from semif_proxy.settings.defaults import DEFAULT_READOUT

READOUT_NAMES = ("letters", "continuation", "direct", "deliberate")
DIRECT_TYPES = ("noul", "score")


class Readouts(BaseModel):
    """The default readout per question type; `default` applies where no type is named."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    default: str = DEFAULT_READOUT
    decision: str | None = None
    noul: str | None = None
    choice: str | None = None
    score: str | None = None

    @model_validator(mode="after")
    def _known(self) -> Readouts:
        for kind, value in self.model_dump().items():
            if value is not None:
                check(kind, value)
        return self

    def for_type(self, kind: str) -> str:
        value = getattr(self, kind, None)
        return value if value is not None else self.default

    def describe(self) -> str:
        """One line for the ready log: the default, and each type that differs."""
        named = [f"{k}={v}" for k, v in self.model_dump().items() if k != "default" and v]
        return ", ".join([self.default, *named])


def check(kind: str, value: str) -> None:
    if value not in READOUT_NAMES:
        raise ValueError(f"{kind}: {value!r} is not a readout (one of {', '.join(READOUT_NAMES)})")
    if value == "direct" and kind not in DIRECT_TYPES:
        raise ValueError(
            f"{kind}: direct reads yes/no and score questions only; name it per type "
            '(e.g. {"noul": "direct", "score": "direct"})'
        )


def parse_readouts(value: str) -> Readouts:
    """SEMIF_READOUT: a readout's name, or a JSON object of them by question type."""
    text = value.strip()
    if not text.startswith("{"):
        check("default", text.lower())
        return Readouts(default=text.lower())
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    kinds = Readouts.model_fields
    if not isinstance(parsed, dict):
        raise ValueError("expected a readout's name or a JSON object by question type")
    for kind, name in parsed.items():
        if kind not in kinds:
            raise ValueError(f"{kind!r} is not a question type (one of {', '.join(kinds)})")
        if not isinstance(name, str):
            raise ValueError(f"{kind}: expected a readout's name, got {name!r}")
        check(kind, name.lower())
    return Readouts(**{k: v.lower() for k, v in parsed.items()})


__all__ = ["DIRECT_TYPES", "READOUT_NAMES", "Readouts", "check", "parse_readouts"]

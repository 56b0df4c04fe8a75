"""SEMIF_READOUT, SEMIF_NORMALIZATION and SEMIF_BIAS_CORRECTION: how a decision or System One
question is read when it says nothing of it (issue #35). Each is one word for every question
type ("continuation", "pmi", "contextual"), or a JSON object by type as SEMIF_CALIBRATION's
temperatures are given (`{"noul": "direct", "score": "direct"}`; `default` for the types not
named). A request's own `readout` / `normalization` / `bias_correction` always wins; a
normalisation applies to questions read by continuation only.

`direct` reads yes/no and score answers only, so it may be the default of `noul` and `score`
alone: a server default that refused every other question would be no default."""

from __future__ import annotations

import json
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from semif_proxy.settings.defaults import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_BIAS_CORRECTION_BY_TYPE,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
)

READOUT_NAMES = ("letters", "continuation", "direct", "deliberate")
NORMALIZATION_NAMES = ("sum", "mean", "pmi")
BIAS_CORRECTION_NAMES = ("none", "contextual")
DIRECT_TYPES = ("noul", "score")


class _PerType(BaseModel):
    """A value per question type; `default` applies where no type is named."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    names: ClassVar[tuple[str, ...]] = ()
    what: ClassVar[str] = ""
    # The built-in value of a type that differs from `default`: a setting of one name, or a
    # JSON object's `default`, replaces it too (it names every type the object does not).
    by_type: ClassVar[dict[str, str]] = {}
    default: str
    decision: str | None = None
    noul: str | None = None
    choice: str | None = None
    score: str | None = None

    @model_validator(mode="after")
    def _known(self) -> _PerType:
        for kind, value in self.model_dump().items():
            if value is not None:
                self.check(kind, value)
        return self

    @classmethod
    def check(cls, kind: str, value: str) -> None:
        if value not in cls.names:
            raise ValueError(f"{kind}: {value!r} is not {cls.what} (one of {', '.join(cls.names)})")

    def for_type(self, kind: str) -> str:
        value = getattr(self, kind, None)
        return value if value is not None else self.default

    def shown(self) -> dict[str, str]:
        """`default` and each type that differs from it (/health)."""
        named = {k: v for k, v in self.model_dump().items() if v and v != self.default}
        return {"default": self.default, **named}

    def describe(self) -> str:
        """One line for the ready log: the default, and each type that differs."""
        return ", ".join(f"{k}={v}" if k != "default" else v for k, v in self.shown().items())


T = TypeVar("T", bound=_PerType)


class Readouts(_PerType):
    names: ClassVar[tuple[str, ...]] = READOUT_NAMES
    what: ClassVar[str] = "a readout"
    default: str = DEFAULT_READOUT

    @classmethod
    def check(cls, kind: str, value: str) -> None:
        super().check(kind, value)
        if value == "direct" and kind not in DIRECT_TYPES:
            raise ValueError(
                f"{kind}: direct reads yes/no and score questions only; name it per type "
                '(e.g. {"noul": "direct", "score": "direct"})'
            )


class Normalizations(_PerType):
    names: ClassVar[tuple[str, ...]] = NORMALIZATION_NAMES
    what: ClassVar[str] = "a continuation's normalization"
    default: str = DEFAULT_NORMALIZATION


class BiasCorrections(_PerType):
    names: ClassVar[tuple[str, ...]] = BIAS_CORRECTION_NAMES
    what: ClassVar[str] = "a bias correction"
    by_type: ClassVar[dict[str, str]] = DEFAULT_BIAS_CORRECTION_BY_TYPE
    default: str = DEFAULT_BIAS_CORRECTION
    noul: str | None = DEFAULT_BIAS_CORRECTION_BY_TYPE.get("noul")

    @classmethod
    def check(cls, kind: str, value: str) -> None:
        if value == "batch":
            # A default applies to every question, also one alone in its request, which a
            # batch correction must refuse (it would make any answer uniform).
            raise ValueError(
                f"{kind}: batch is asked per request (`bias_correction: batch` on the "
                "questions of a batch), not as a server default: a question alone in its "
                "request has no batch to be calibrated over"
            )
        super().check(kind, value)


def parse_per_type(value: str, model: type[T]) -> T:
    """A name for every type, or a JSON object of names by question type."""
    text = value.strip()
    if not text.startswith("{"):
        model.check("default", text.lower())
        return model(default=text.lower(), **dict.fromkeys(model.by_type, text.lower()))
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    kinds = list(model.model_fields)  # the types and `default` (ClassVars are no fields)
    for kind, name in parsed.items():
        if kind not in kinds:
            raise ValueError(f"{kind!r} is not a question type (one of {', '.join(kinds)})")
        if not isinstance(name, str):
            raise ValueError(f"{kind}: expected a name, got {name!r}")
        model.check(kind, name.lower())
    if "default" in parsed:
        parsed = {**dict.fromkeys(model.by_type, parsed["default"]), **parsed}
    return model(**{k: v.lower() for k, v in parsed.items()})


def parse_readouts(value: str) -> Readouts:
    return parse_per_type(value, Readouts)


def parse_normalizations(value: str) -> Normalizations:
    return parse_per_type(value, Normalizations)


def parse_bias_corrections(value: str) -> BiasCorrections:
    return parse_per_type(value, BiasCorrections)


__all__ = [
    "BIAS_CORRECTION_NAMES",
    "DIRECT_TYPES",
    "NORMALIZATION_NAMES",
    "READOUT_NAMES",
    "BiasCorrections",
    "Normalizations",
    "Readouts",
    "parse_bias_corrections",
    "parse_normalizations",
    "parse_readouts",
]

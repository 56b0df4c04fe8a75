"""TypeSafe's System One request (noul / choice / score questions) as validated models, their
errors in FastAPI's 422 shape, and the model names a request may use (GET /v1/models)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from semif_proxy.api.readout_fields import (
    BiasCorrection,
    Normalization,
    Readout,
)
from semif_proxy.engine.prompt import MAX_OPTIONS
from semif_proxy.errors import SchemaError

Content = str | dict[str, Any] | list[Any]
# Names Jev clients send by default; each one means the model served here.
ALIASES = ("jev-latest", "jev-preview")
# Clients pinned to a release send jev-1.<n> (jev-1.0, jev-1.2, ...): accepted, one listed.
VERSIONED = re.compile(r"jev-1\.[0-9]+")
LISTED_VERSION = "jev-1.0"
DEFAULT_INSTRUCTIONS = {
    "noul": "Decide whether the instructions hold for the evidence.",
    "choice": "Choose the option that fits the evidence best.",
    "score": "Rate the evidence on the listed levels.",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Read(_Strict):
    """How a question's options are read (as a decision's: api/readout_fields.py); semif-proxy's
    own fields, which TypeSafe clients do not send."""

    readout: Readout | None = None  # None: the server's (SEMIF_READOUT), letters unless set
    normalization: Normalization | None = None  # continuation only; None: SEMIF_NORMALIZATION's
    bias_correction: BiasCorrection | None = None  # None: SEMIF_BIAS_CORRECTION's, "none"
    deliberation_tokens: StrictInt | None = Field(None, ge=1)  # deliberate only
    return_reasoning: bool = False  # deliberate only


class NoulCriteria(_Strict):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(_Read):
    type: Literal["noul"]
    instructions: Content | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Read):
    type: Literal["choice"]
    instructions: Content | None = None
    # One option is answered without the model (probability 1); Jev allows 1..255.
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=MAX_OPTIONS)


class ScoreQuestion(_Read):
    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(min_length=2, max_length=MAX_OPTIONS)


QuestionModel = Annotated[
    NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")
]


class _RequestBase(_Strict):
    """What a System One request and a batch share: everything but the state(s)."""

    model: str
    questions: dict[str, QuestionModel] = Field(min_length=1)
    permutations: int | None = Field(None, ge=1, le=MAX_OPTIONS)
    # false: no fitted position prior (SEMIF_CALIBRATION) is applied to this request.
    position_prior: bool = True
    # A number or a map by question type and option count, checked by `thresholds` (a 422 at
    # its path in the value); None: SEMIF_MIN_CONFIDENCE.
    min_confidence: Any = None


class SystemOneRequest(_RequestBase):
    state: Content


class SystemOneBatchRequest(_RequestBase):
    """POST /v1/systemone/batch: a System One request with `states` in place of `state`."""

    states: list[Content] = Field(min_length=1)


Parsed = SystemOneRequest | SystemOneBatchRequest
P = TypeVar("P", SystemOneRequest, SystemOneBatchRequest)


MAX_ERRORS = 20


def validate(model: type[P], body: Any) -> P:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # The first errors are what a client fixes; thousands of them are only bytes.
        detail = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False)[:MAX_ERRORS]
        ]
        raise SchemaError(detail) from None


def parse_request(body: Any) -> SystemOneRequest:
    return validate(SystemOneRequest, body)


def schema_error(loc: list[str | int], msg: str, kind: str = "value_error") -> SchemaError:
    return SchemaError([{"loc": ["body", *loc], "msg": msg, "type": kind}])


def served_model_id(model_path: Path, sha256: str) -> str:
    return f"{model_path.stem.lower()}@{sha256[:12]}"


def accepts_model(name: str, served: str) -> bool:
    """The served id, an alias, or a versioned jev-1.<n> id: all name the one model here."""
    return name == served or name in ALIASES or VERSIONED.fullmatch(name) is not None


def models_listing(model_path: Path, sha256: str) -> dict[str, Any]:
    """GET /v1/models: the served id and its aliases, for System One and OpenAI clients."""
    released = (
        datetime.fromtimestamp(model_path.stat().st_mtime, tz=timezone.utc).date().isoformat()
    )
    served = served_model_id(model_path, sha256)
    descriptions = {
        served: f"{model_path.name} (sha256 {sha256[:12]}) served by semif-proxy",
        **{alias: f"alias of {served}" for alias in ALIASES},
        LISTED_VERSION: f"alias of {served}; every jev-1.<n> (jev-1.0, jev-1.2, ...) is accepted",
    }
    names = list(descriptions)
    return {
        "models": [
            {"name": n, "description": descriptions[n], "release_date": released} for n in names
        ],
        # OpenAI clients read "data"; System One clients read "models".
        "object": "list",
        "data": [{"id": n, "object": "model", "owned_by": "semif-proxy"} for n in names],
    }

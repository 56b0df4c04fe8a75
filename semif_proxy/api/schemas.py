"""Request models for the decision path, the validation rules across them, and pydantic errors
turned into the API error shape. Pure: no engine, no HTTP."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    field_validator,
)

from semif_proxy.api.readout_fields import (
    DIRECT_NEEDS,
    BiasCorrection,
    Normalization,
    Readout,
    deliberation_error,
    direct_answers,
    normalization_error,
)
from semif_proxy.engine.prompt import MAX_OPTIONS
from semif_proxy.errors import InvalidRequest, PayloadTooLarge

NonEmpty = Annotated[str, StringConstraints(min_length=1)]
State = NonEmpty | dict[str, Any] | list[Any]


class Option(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: NonEmpty
    description: str


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: NonEmpty
    state: State
    question: NonEmpty
    # One option is answered without the model (probability 1); Jev allows 1..255.
    options: list[Option] = Field(min_length=1, max_length=MAX_OPTIONS)
    return_prompt: bool = False
    # Cyclic rotations of the option order to average (None: SEMIF_PERMUTATIONS, default 1).
    permutations: int | None = Field(None, ge=1, le=MAX_OPTIONS)
    # false: no fitted position prior (SEMIF_CALIBRATION) is applied to this decision.
    position_prior: bool = True
    # How the options are read (docs/method.md): their letters (the default), each option's
    # text as the answer (continuation: normalised as asked, else per SEMIF_NORMALIZATION,
    # "pmi" unless set), or the model's own yes/no or level-number tokens (direct: yes/no and
    # score decisions only). A contextual bias correction divides out the answers after a
    # content-free state.
    readout: Readout | None = None  # None: the server's (SEMIF_READOUT), letters unless set
    normalization: Normalization | None = None  # continuation only; None: SEMIF_NORMALIZATION's
    bias_correction: BiasCorrection | None = None  # None: SEMIF_BIAS_CORRECTION's, "none"
    # deliberate only: the most tokens the model writes before its letters are read (None: the
    # default, at most SEMIF_MAX_DELIBERATION_TOKENS), and whether the answer returns that text.
    deliberation_tokens: StrictInt | None = Field(None, ge=1)
    return_reasoning: bool = False

    @field_validator("options")
    @classmethod
    def _unique_option_ids(cls, options: list[Option]) -> list[Option]:
        ids = [o.id for o in options]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"option ids must be unique; repeated: {duplicates}")
        return options

    def answers(self) -> tuple[str, ...] | None:
        """The direct readout's answer word per option (yes/no or a level number)."""
        return direct_answers([o.id for o in self.options])

    def state_key(self) -> str:
        return json.dumps(self.state, ensure_ascii=False)


class SingleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    decision: Decision


class SharedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    decisions: list[Decision] = Field(min_length=1)


def check_shared(request: SharedRequest) -> None:
    """Cross-decision rules, reported with the exact field that breaks them."""
    seen: dict[str, int] = {}
    for i, d in enumerate(request.decisions):
        if d.id in seen:
            raise InvalidRequest(
                f"decisions[{i}].id: {d.id!r} repeats decisions[{seen[d.id]}].id; "
                "ids must be unique",
                field=f"decisions[{i}].id",
            )
        seen[d.id] = i
    first = request.decisions[0].state_key()
    for i, d in enumerate(request.decisions[1:], start=1):
        if d.state_key() != first:
            raise InvalidRequest(
                f"decisions[{i}].state differs from decisions[0].state; a shared request needs "
                "the identical state in every decision",
                field=f"decisions[{i}].state",
            )


def check_readouts(decisions: list[Decision], paths: list[str]) -> None:
    """A readout's own rules, reported at the field that breaks them (400)."""
    for d, path in zip(decisions, paths):
        problem = normalization_error(d.readout, d.normalization)
        if problem:
            raise InvalidRequest(f"{path}.normalization: {problem}", field=f"{path}.normalization")
        if d.readout == "direct" and d.answers() is None:
            raise InvalidRequest(f"{path}.readout: {DIRECT_NEEDS}", field=f"{path}.readout")
        wrong = deliberation_error(d.readout, d.deliberation_tokens, d.return_reasoning)
        if wrong:
            raise InvalidRequest(f"{path}.{wrong[0]}: {wrong[1]}", field=f"{path}.{wrong[0]}")


def check_count(count: int, field: str, limit: int, variable: str = "SEMIF_MAX_DECISIONS") -> None:
    """A per-request count limit (413 naming the field, the limit and its setting)."""
    if count > limit:
        noun = field.rsplit(".", 1)[-1]
        raise PayloadTooLarge(
            f"{field}: {count} {noun}, over the limit of {limit} ({variable})",
            field=field,
            count=count,
            limit=limit,
        )


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # Union members show up as loc parts like 'str' / 'dict[str,any]'; they name no field.
            if part in ("str", "dict[str,any]", "list[any]", "constrained-str"):
                continue
            out += f".{part}" if out else str(part)
    return out or "body"


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = field_path(tuple(first["loc"]))
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{field}: {message}", field=field) from None

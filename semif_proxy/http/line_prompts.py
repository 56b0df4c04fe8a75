"""A JSON Lines line's prompts, counted from its raw keys before its questions are built: a
body limit's worth of lines each asking 64 questions in 26 orders would otherwise hold a
quarter of a GB of questions for one call (http/jsonlines.py plans the lines)."""

from __future__ import annotations

from typing import Any

from semif_proxy.errors import PayloadTooLarge
from semif_proxy.settings import Settings


def prompt_limit(settings: Settings) -> int:
    """The most prompts (questions x option orders) one line may ask: SEMIF_MAX_QUESTIONS at
    the server's own SEMIF_PERMUTATIONS, so any line that keeps the default orders fits."""
    return settings.max_questions * settings.permutations


def _orders(value: Any, default: int) -> int:
    # The count a line asks for; a bad value is the schema's to name, so it counts as default.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def count_prompts(body: dict[str, Any], shape: str, default: int) -> int:
    """How many prompts a line would ask, from its raw keys (no validation, nothing built):
    each question or decision once per option order it asks for (an upper bound: a question
    with fewer options than orders is asked fewer times)."""
    if shape == "systemone":
        questions = body.get("questions")
        count = len(questions) if isinstance(questions, dict) else 0
        return count * _orders(body.get("permutations"), default)
    asked = body.get("decisions") if "decisions" in body else [body.get("decision")]
    if not isinstance(asked, list):
        return 0
    return sum(
        _orders(d.get("permutations") if isinstance(d, dict) else None, default) for d in asked
    )


def check_prompts(body: dict[str, Any], shape: str, settings: Settings) -> None:
    """Refuse a line that would ask too many prompts before its questions are built: a body
    limit's worth of lines each asking 64 questions in 26 orders would otherwise hold a
    quarter of a GB of questions for one call."""
    asked = body.get("questions") if shape == "systemone" else body.get("decisions")
    most = settings.max_questions if shape == "systemone" else settings.max_decisions
    if isinstance(asked, (dict, list)) and len(asked) > most:
        return  # the request's own count limit refuses it, naming its field, as it would alone
    count, limit = count_prompts(body, shape, settings.permutations), prompt_limit(settings)
    if count > limit:
        raise PayloadTooLarge(
            f"the line asks {count} prompts (questions x permutations), over the limit of "
            f"{limit} for a JSON Lines line (SEMIF_MAX_QUESTIONS x SEMIF_PERMUTATIONS); send "
            "it as its own application/json request",
            field="body",
            prompts=count,
            limit=limit,
        )

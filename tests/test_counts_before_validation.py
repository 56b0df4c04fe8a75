"""Counts are limits before they are work: a body with a million entries is refused by its
count, not validated entry by entry (seconds of CPU and gigabytes of error objects on the event
loop), and a 422 lists the first errors, not all of them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from semif_proxy.api import decisions, systemone, systemone_batch, systemone_schemas
from semif_proxy.errors import PayloadTooLarge, SchemaError
from semif_proxy.settings import load_settings

MANY = 300_000


def test_a_flood_of_decisions_is_refused_by_its_count() -> None:
    started = time.process_time()
    with pytest.raises(PayloadTooLarge) as refused:
        decisions.parse_request({"decisions": [{}] * MANY}, max_decisions=32)
    assert refused.value.field == "decisions"
    assert "SEMIF_MAX_DECISIONS" in refused.value.message and str(MANY) in refused.value.message
    # Validating them would take seconds; counting takes nothing (CPU time, not wall clock).
    assert time.process_time() - started < 1.0


def test_a_flood_of_questions_is_refused_by_its_count(model_path: Path) -> None:
    settings = load_settings({}, model=str(model_path))
    body = {"model": "jev-latest", "state": "s", "questions": {f"q{i}": {} for i in range(MANY)}}
    with pytest.raises(PayloadTooLarge) as refused:
        systemone.plan(body, settings, "0" * 64)
    assert refused.value.field == "questions"
    assert "SEMIF_MAX_QUESTIONS" in refused.value.message
    batch = {**body, "states": ["a", "b"]}
    with pytest.raises(PayloadTooLarge):
        systemone_batch.plan_batch(batch, settings, "0" * 64)


def test_a_422_lists_the_first_errors_only(model_path: Path) -> None:
    settings = load_settings({}, model=str(model_path))
    questions = {f"q{i}": {"type": "no such type"} for i in range(settings.max_questions)}
    body = {"model": "jev-latest", "state": "s", "questions": questions}
    with pytest.raises(SchemaError) as refused:
        systemone.plan(body, settings, "0" * 64)
    detail = refused.value.detail
    assert len(detail) == systemone_schemas.MAX_ERRORS < settings.max_questions
    assert detail[0]["loc"][:3] == ["body", "questions", "q0"]

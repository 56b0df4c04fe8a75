"""The question types that temperatures, position priors and abstention thresholds are kept
per: a decision (/v1/decisions) and System One's three kinds. `default` stands for every type
(the value used where a type has none of its own)."""

from __future__ import annotations

QUESTION_TYPES = ("noul", "choice", "score", "decision")
DEFAULT = "default"

__all__ = ["DEFAULT", "QUESTION_TYPES"]

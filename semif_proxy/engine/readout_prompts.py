"""The prompts of the readouts other than letters (issue #35). Pure: no HTTP, no engine.

- continuation (`semif-continuation-v2`): the options listed as plain texts; the answer is
  one option's text, which is what gets scored. A version names how the numbers are made, the
  prompt and its reading: v2 is v1's prompt with each option read as one evaluation of
  prompt + option (continuation.py), not one per token, which moves its numbers (an option's
  summed log-probability by up to 0.07 on the Qwen2.5-Coder models, docs/method.md), so what
  was fitted on v1 answers is refit.
- direct yes/no (`semif-direct-yesno-v1`): the question asked for yes or no; the model's own
  "yes" / "no" tokens are read.
- direct levels (`semif-direct-levels-v1`): the levels listed with their numbers; the model's
  own number tokens are read.
- deliberate (`semif-deliberate-v1`): the letters prompt, asked to reason briefly first; the
  model's reasoning is generated, ANSWER_CUE appended, and the letters read after it.

Each has its own system text, so a letters question and a continuation question on the same
state are two prompt heads, as letters and numbers are. The user turn starts with the
evidence, so the state is a shared prefix of every question on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from semif_proxy.engine.prompt import (
    LETTER_LABELS,
    ChatTemplate,
    Labels,
    RenderedPrompt,
    render_messages,
)

CONTINUATION_VERSION = "semif-continuation-v2"
YES_NO_VERSION = "semif-direct-yesno-v1"
LEVELS_VERSION = "semif-direct-levels-v1"
DELIBERATE_VERSION = "semif-deliberate-v1"
# The content-free state (Zhao et al. 2021) of PMI and contextual bias correction.
CONTENT_FREE_STATE = "N/A"
YES_NO = ("yes", "no")

CONTINUATION_SYSTEM = (
    "You are a careful decision function. Apply the criterion to the evidence and choose the "
    "one listed option that fits best. Answer with only the text of that option, exactly as "
    "listed, nothing else."
)
YES_NO_SYSTEM = (
    "You are a careful decision function. Apply the criterion to the evidence and answer the "
    "question. Answer with only yes or no, nothing else."
)
LEVELS_SYSTEM = (
    "You are a careful decision function. Rate the evidence by the criterion on the listed "
    "levels. Answer with only the number of the level that fits best, nothing else."
)
DELIBERATE_SYSTEM = (
    "You are a careful decision function. Apply the criterion to the evidence and choose the "
    "one listed option that fits best. Think it through briefly, step by step, then end with "
    '"So the answer is (X)", where X is the letter of that option.'
)
# Appended after the model's reasoning; the letters are read at its end. It ends in "(" so the
# bare letter ("A", the letters readout's token) is how the text goes on: after a space the
# tokenizer would write " A" instead (checked per model: deliberate.py).
ANSWER_CUE = "\nSo the answer is ("
# The letters prompt with its own system text: options lettered as for letters.
DELIBERATE_LABELS = Labels(
    "letters", DELIBERATE_VERSION, LETTER_LABELS.key, LETTER_LABELS.limit, DELIBERATE_SYSTEM
)


@dataclass(frozen=True)
class ReadoutPrompt:
    """A readout's prompt: its version and how its user turn lists the options."""

    version: str
    system_text: str
    kind: str  # "continuation", "yes_no", "levels"


CONTINUATION_PROMPT = ReadoutPrompt(CONTINUATION_VERSION, CONTINUATION_SYSTEM, "continuation")
YES_NO_PROMPT = ReadoutPrompt(YES_NO_VERSION, YES_NO_SYSTEM, "yes_no")
LEVELS_PROMPT = ReadoutPrompt(LEVELS_VERSION, LEVELS_SYSTEM, "levels")


def direct_kind(answers: Sequence[str]) -> ReadoutPrompt:
    """Yes/no when the answers are yes and no, levels otherwise."""
    return YES_NO_PROMPT if sorted(answers) == sorted(YES_NO) else LEVELS_PROMPT


def user_payload(
    prompt: ReadoutPrompt,
    state: Any,
    question: str,
    descriptions: Sequence[str],
    answers: Sequence[str] | None,
) -> dict[str, Any]:
    if prompt.kind == "continuation":
        options: Any = list(descriptions)
        return {"evidence": state, "criterion": question, "options": options}
    if answers is None or len(answers) != len(descriptions):
        raise ValueError("a direct readout needs one answer word per option")
    if prompt.kind == "yes_no":
        listed = [{"answer": a, "description": d} for a, d in zip(answers, descriptions)]
        return {"evidence": state, "criterion": question, "answers": listed}
    levels = [{"level": a, "description": d} for a, d in zip(answers, descriptions)]
    return {"evidence": state, "criterion": question, "levels": levels}


def render(
    template: ChatTemplate,
    prompt: ReadoutPrompt,
    state: Any,
    question: str,
    descriptions: Sequence[str],
    answers: Sequence[str] | None = None,
) -> RenderedPrompt:
    content = json.dumps(
        user_payload(prompt, state, question, descriptions, answers), ensure_ascii=False
    )
    messages = [
        {"role": "system", "content": prompt.system_text},
        {"role": "user", "content": content},
    ]
    return render_messages(template, messages, state)

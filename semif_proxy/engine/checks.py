"""What the engine checks before any forward pass: every text free of the model's special
tokens, the label scheme the option count needs, and the token limits (each prompt, and the
whole request's budget, a lower bound first so a request that cannot fit is refused before its
prompts are built). A part of DecisionEngine (worker.py), which holds what these read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from semif_proxy.engine.prompt import (
    NUMBER_LABELS,
    Labels,
    RenderedPrompt,
    labels_for,
    render_decision,
)
from semif_proxy.engine.questions import LETTERS, Question
from semif_proxy.errors import InvalidRequest, PayloadTooLarge
from semif_proxy.settings import AUTO_CTX_MAX

if TYPE_CHECKING:
    from semif_proxy.engine import native
    from semif_proxy.engine.injection import SpecialTokenPolicy
    from semif_proxy.engine.prompt import ChatTemplate, NumberCheck
    from semif_proxy.settings import Settings


class TokenChecks:
    core: native.Engine
    settings: Settings
    template: ChatTemplate
    special_tokens: SpecialTokenPolicy
    max_token_bytes: int
    numbers: NumberCheck

    def tokenize_prompt(self, text: str) -> list[int]:
        # Exactly what llama-server does with a prompt string: specials parsed, BOS as the
        # model asks. That makes our prompts and llama-server's /completion comparable.
        return list(self.core.tokenize(text, add_special=True, parse_special=True))

    def _check_special_tokens(self, questions: Sequence[Question]) -> None:
        """Every text that reaches a prompt, checked once (rotations share their texts)."""
        checked: set[int] = set()
        for q in questions:
            for value, where in (
                (q.id, f"{q.path}.id"),
                (q.state, f"{q.path}.state"),
                (q.question, f"{q.path}.question"),
                *((d, f"{q.path}.options[{i}].description") for i, d in enumerate(q.descriptions)),
            ):
                if id(value) not in checked:
                    checked.add(id(value))
                    self.special_tokens.check(value, where)

    def _check_limits(self, questions: Sequence[Question], fulls: Sequence[list[int]]) -> None:
        limit = self.settings.prompt_token_limit
        for q, tokens in zip(questions, fulls):
            if len(tokens) > limit:
                raise PayloadTooLarge(
                    f"{q.path}: the prompt is {len(tokens)} tokens, over the limit of {limit} "
                    f"(SEMIF_MAX_PROMPT_TOKENS, else the engine's context: SEMIF_CTX_SIZE, by "
                    f"default the model's training context up to {AUTO_CTX_MAX}); shorten the "
                    "state or the option descriptions, or raise the context",
                    field=q.path,
                    tokens=len(tokens),
                    limit=limit,
                )

    def _check_request_tokens(self, evaluated: int, at_least: bool = False) -> None:
        limit = self.settings.request_token_limit
        if evaluated > limit:
            needs = "at least " if at_least else ""
            raise PayloadTooLarge(
                f"the request needs {needs}{evaluated} evaluated tokens, over the limit of "
                f"{limit} (SEMIF_MAX_REQUEST_TOKENS)",
                field="body",
                tokens=evaluated,
                limit=limit,
            )

    def state_tokens(self, first: Question, field: str) -> int:
        """The state's own tokens (its prompt head), refused (413 naming `field`) when the state
        alone reaches the prompt limit. No token is longer than the vocabulary's longest piece:
        a state with more bytes than limit x that cannot fit, and is refused before the
        tokenizer reads all of it."""
        head = self._render(first)
        limit = self.settings.prompt_token_limit
        size = len(head.state_prefix.encode("utf-8"))
        count = -(-size // self.max_token_bytes)
        if count < limit:
            count = len(self.core.tokenize(head.state_prefix, True, True))
        if count >= limit:
            raise PayloadTooLarge(
                f"{field}: the state alone is {count} tokens, over the prompt limit of {limit}",
                field=field,
                tokens=count,
                limit=limit,
            )
        return count

    def asked_tokens(self, questions: Sequence[Question]) -> int:
        """A lower bound on what the questions add to a state: each text's own tokens, less
        one for a merge at either edge."""
        counts: dict[str, int] = {}

        def tokens(text: str) -> int:
            if text not in counts:
                counts[text] = max(0, len(self.core.tokenize(text, False, False)) - 1)
            return counts[text]

        return sum(tokens(q.question) + sum(tokens(d) for d in q.descriptions) for q in questions)

    def _check_budget(self, questions: Sequence[Question]) -> None:
        """Refuse a request that cannot fit before any prompt is built: the state's own tokens
        (counted once) against the prompt limit, and the state plus every question's own text
        against the request's token budget. Rendering and tokenizing every prompt of a large
        request (questions x rotations, each holding the state) is real work; it only starts
        once the request is known to fit."""
        first = questions[0]
        lower = self.state_tokens(first, f"{first.path}.state") + self.asked_tokens(questions)
        self._check_request_tokens(lower, at_least=True)

    def labels_for(self, n: int) -> Labels:
        return labels_for(n, self.settings.labels)

    if TYPE_CHECKING:  # ReadoutScoring's, later in DecisionEngine's bases

        def _render_readout(self, q: Question) -> RenderedPrompt: ...
        def _check_readout(self, q: Question) -> None: ...

    def _render(self, q: Question) -> RenderedPrompt:
        if q.readout != LETTERS:
            return self._render_readout(q)
        labels = self.labels_for(len(q.descriptions))
        return render_decision(self.template, q.state, q.question, q.descriptions, labels)

    def _check_label_scheme(self, q: Question) -> None:
        if q.readout != LETTERS:
            self._check_readout(q)
            return
        if self.labels_for(len(q.descriptions)) is NUMBER_LABELS and self.numbers.reason:
            raise InvalidRequest(
                f"{q.path}.options: {len(q.descriptions)} options need numbered labels, which "
                f"this model cannot score: {self.numbers.reason}",
                field=f"{q.path}.options",
            )

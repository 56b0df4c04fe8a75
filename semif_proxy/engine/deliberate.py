"""The deliberate readout (issue #35): the model writes up to `deliberation_tokens` tokens of
reasoning after a letters prompt that asks for it (greedy, in the engine: Engine.generate),
ANSWER_CUE is appended, and the option letters are read after it as the letters readout reads
them (the same letter tokens, softmax and temperature).

- The reasoning is generated after each question's whole prompt as the letters path
  evaluates it: the proven, aligned split after the state (scoring.py), the prefix evaluated
  once (or reused, or restored from the prefix cache) and each question's rest decoded after
  it. The prompt's last row is then its one-piece evaluation's, bit for bit on the CPU, so the
  text does not depend on what the engine held before; and a question asked in k option
  orders (permutations) evaluates its state once instead of k times.
- The letters are read from prompt + reasoning + cue as one text, tokenized as llama-server
  tokenizes it, through the letters path itself (scoring.py: the proven, aligned split after
  the state, each question's rest a restore-mode branch). Its numbers are that text's
  one-piece evaluation, bit for bit on the CPU (tests/test_deliberate.py).

Cost: the state's prefix once, per question its rest and one forward pass per generated
token, then the letters read over the longer text (after the same prefix, still held). A
part of DecisionEngine (worker.py), which holds what these read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from semif_proxy.engine.prompt import LETTERS, RenderedPrompt, render_decision
from semif_proxy.engine.questions import (
    DELIBERATE_READOUT,
    Deliberation,
    GroupPlan,
    Question,
    Scored,
)
from semif_proxy.engine.readout_prompts import ANSWER_CUE, DELIBERATE_LABELS, DELIBERATE_VERSION
from semif_proxy.errors import InvalidRequest, PayloadTooLarge

if TYPE_CHECKING:
    from semif_proxy.engine import native
    from semif_proxy.engine.prompt import ChatTemplate, NumberCheck
    from semif_proxy.settings import Settings


class DeliberateScoring:
    core: native.Engine
    settings: Settings
    template: ChatTemplate
    letter_ids: list[int]
    numbers: NumberCheck

    if TYPE_CHECKING:  # TokenChecks' and GroupScoring's, earlier in DecisionEngine's bases

        def tokenize_prompt(self, text: str) -> list[int]: ...
        def split(self, state_tokens: list[int], fulls: Sequence[list[int]]) -> Any: ...
        def _cached(self, prefix: list[int], call: Any) -> Any: ...
        def _evaluate_letters_group(
            self, plan: GroupPlan
        ) -> tuple[list[Scored], dict[str, Any]]: ...

    def _render_deliberate(self, q: Question) -> RenderedPrompt:
        return render_decision(
            self.template, q.state, q.question, q.descriptions, DELIBERATE_LABELS
        )

    @cached_property
    def _cue_problem(self) -> str | None:
        """Why letters cannot be read after ANSWER_CUE with this model's tokenizer, or None: each
        letter appended to prompt + cue must append exactly its own token (as check_letters
        asks of the letters prompt), or the letter read would not be how the text goes on."""
        sample = render_decision(
            self.template, "evidence", "criterion", ["first", "second"], DELIBERATE_LABELS
        ).text + "Both fit; the first fits better." + ANSWER_CUE  # fmt: skip
        base = self.tokenize_prompt(sample)
        for letter, token in zip(LETTERS, self.letter_ids):
            if self.tokenize_prompt(sample + letter) != [*base, token]:
                return f"the answer cue {ANSWER_CUE!r} + {letter!r} merges into other tokens"
        return None

    def _check_deliberate(self, q: Question) -> None:
        """A deliberate question's own rules, refused before any forward pass (400 naming the
        field)."""
        limit = self.settings.max_deliberation_tokens
        if q.deliberation_tokens > limit:
            raise InvalidRequest(
                f"{q.path}.deliberation_tokens: {q.deliberation_tokens} is over the limit of "
                f"{limit} (SEMIF_MAX_DELIBERATION_TOKENS)",
                field=f"{q.path}.deliberation_tokens",
            )
        if len(q.descriptions) > DELIBERATE_LABELS.limit:
            raise InvalidRequest(
                f"{q.path}.readout: deliberate reads option letters: at most "
                f"{DELIBERATE_LABELS.limit} options, not {len(q.descriptions)}",
                field=f"{q.path}.readout",
            )
        if self._cue_problem:
            raise InvalidRequest(
                f"{q.path}.readout: deliberate is unavailable for this model: "
                f"{self._cue_problem}; use readout letters",
                field=f"{q.path}.readout",
            )

    def _plan_deliberate_group(
        self,
        questions: list[Question],
        rendered: list[RenderedPrompt],
        fulls: list[list[int]],
        head: str,
    ) -> GroupPlan:
        """Each prompt with its whole budget and the cue must fit the prompt limit (413 as for
        letters). The tokens counted are the most it can take: each prompt whole and its budget
        (the generation), then the read as a letters group over the longer prompts."""
        cue = len(self.core.tokenize(ANSWER_CUE, add_special=False, parse_special=False))
        limit = self.settings.prompt_token_limit
        for q, f in zip(questions, fulls):
            most = len(f) + q.deliberation_tokens + cue
            if most > limit:
                raise PayloadTooLarge(
                    f"{q.path}: the prompt with its deliberation_tokens ({q.deliberation_tokens}) "
                    f"and the answer cue is {most} tokens, over the limit of {limit} "
                    "(SEMIF_MAX_PROMPT_TOKENS, else the engine's context: SEMIF_CTX_SIZE); "
                    "shorten the state, lower deliberation_tokens, or raise the context",
                    field=q.path,
                    tokens=most,
                    limit=limit,
                )
        state_tokens = self.tokenize_prompt(head)
        prefix, boundary = self.split(state_tokens, fulls)
        budgets = [q.deliberation_tokens for q in questions]
        # The generation and the read each evaluate the prefix at most once.
        evaluated = 2 * len(prefix) + sum(
            2 * (len(f) - len(prefix) + n) + cue for f, n in zip(fulls, budgets)
        )
        return GroupPlan(
            questions, rendered, fulls, state_tokens, prefix, boundary, [None] * len(questions),
            evaluated, budgets,
        )  # fmt: skip

    def _evaluate_deliberate_group(self, plan: GroupPlan) -> tuple[list[Scored], dict[str, Any]]:
        start = time.perf_counter()
        held = len(plan.prefix)
        made = [self._deliberate(q, f, held) for q, f in zip(plan.questions, plan.fulls)]
        generation = time.perf_counter() - start
        read = [
            RenderedPrompt(r.text + d.text + ANSWER_CUE, r.state_prefix)
            for r, (d, _) in zip(plan.rendered, made)
        ]
        finals = [self.tokenize_prompt(r.text) for r in read]
        prefix, boundary = self.split(plan.state_tokens, finals)
        letters = GroupPlan(
            plan.questions, read, finals, plan.state_tokens, prefix, boundary,
            [None] * len(finals), plan.evaluated,
        )  # fmt: skip
        scored, timing = self._evaluate_letters_group(letters)
        # The tokens it evaluated, not the most it could have (what the plan checked against
        # the budget): each prompt but the prefix it reused, each generated token but a
        # budget's last (nothing reads what follows it), then the read (its prefix too unless
        # still held, as it is after the generation).
        read_tokens = len(prefix) - timing["prefix_reused_tokens"]
        read_tokens += sum(len(f) - len(prefix) for f in finals)
        generated = sum(
            len(f) - stats["prefix_reused"] + d.tokens - (d.tokens > 0 and not d.ended)
            for f, (d, stats) in zip(plan.fulls, made)
        )
        timing["evaluated_tokens"] = generated + read_tokens
        # The request found the prefix as its first evaluation, the generation, found it.
        first = made[0][1]
        timing["prefix_reused_tokens"] = first["prefix_reused"]
        timing["prefix_cache_hit"] = bool(first.get("prefix_cache_hit", False))
        for _, stats in made:
            timing["prefill_seconds"] += stats["prefill_seconds"]
            timing["suffix_seconds"] += stats["suffix_seconds"]
        timing["generated_tokens"] = sum(d.tokens for d, _ in made)
        timing["generation_seconds"] = generation
        out = [
            replace(
                s, readout=DELIBERATE_READOUT, prompt_version=DELIBERATE_VERSION, deliberation=d
            )
            for s, (d, _) in zip(scored, made)
        ]
        return out, timing

    def _deliberate(
        self, q: Question, prompt: list[int], held: int
    ) -> tuple[Deliberation, dict[str, Any]]:
        """The model's greedy reasoning after its prompt, cut at its end of turn or the budget;
        the prompt's first `held` tokens (the group's aligned prefix; 0: none) evaluated once
        for every question of the group, through the prefix cache like the letters read."""
        stop = [self.numbers.end] if self.numbers.end >= 0 else []

        def call() -> tuple[tuple[list[int], int], dict[str, Any]]:
            tokens, ended_by, stats = self.core.generate(prompt, q.deliberation_tokens, stop, held)
            return (tokens, ended_by), stats

        (tokens, ended_by), stats = self._cached(prompt[:held], call) if held else call()
        data = b"".join(self.core.token_piece(t) for t in tokens)
        # The budget may cut a character's bytes short: that incomplete end is left out.
        text = data.decode("utf-8", "ignore")
        return Deliberation(len(tokens), text, ended_by >= 0), stats

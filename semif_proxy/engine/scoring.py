"""How the engine scores a group of questions that share one prompt head: the proven, aligned
prefix evaluated once (or restored from the prefix cache) and each question decoded after it,
lettered questions from their letters' logits, numbered ones from their label sequences (a
label tree); a prompt evaluated whole where no split is proven. A part of DecisionEngine
(worker.py), which holds what these read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from semif_proxy import readout
from semif_proxy.engine import prefix_split
from semif_proxy.engine.label_tree import LabelTree
from semif_proxy.engine.prompt import NUMBER_LABELS, RenderedPrompt
from semif_proxy.engine.questions import (
    DELIBERATE,
    LETTER_READOUT,
    LETTERS,
    SEQUENCE_READOUT,
    SINGLE_OPTION,
    GroupPlan,
    Question,
    Scored,
    add_stats,
    timing,
)

if TYPE_CHECKING:
    from semif_proxy.engine import label_tree, native
    from semif_proxy.engine.prefix_cache import PrefixCache
    from semif_proxy.engine.prompt import Labels

T = TypeVar("T")


class GroupScoring:
    core: native.Engine
    cache: PrefixCache
    letter_ids: list[int]
    branch_mode: str
    trees: label_tree.Trees

    def labels_for(self, n: int) -> Labels: ...  # TokenChecks
    def _render(self, q: Question) -> RenderedPrompt: ...  # TokenChecks
    def tokenize_prompt(self, text: str) -> list[int]: ...  # TokenChecks

    if TYPE_CHECKING:  # ReadoutScoring's, later in DecisionEngine's bases

        def _plan_readout_group(self, *args: Any) -> GroupPlan: ...
        def _evaluate_readout_group(self, plan: GroupPlan) -> Any: ...
        def _plan_deliberate_group(self, *args: Any) -> GroupPlan: ...  # DeliberateScoring's
        def _evaluate_deliberate_group(self, plan: GroupPlan) -> Any: ...

    def split(self, state_tokens: list[int], fulls: Sequence[list[int]]) -> tuple[list[int], int]:
        return prefix_split.split(state_tokens, fulls, self.core.cell_align)

    def _restore_cached(self, prefix: list[int]) -> bool:
        if not self.cache.worth_caching(prefix) or list(self.core.prefix_tokens) == prefix:
            return False
        entry = self.cache.get(prefix)
        if entry is None:
            return False
        state, logits = entry
        self.core.set_prefix_state(state, prefix, logits)
        return True

    def _cached(self, prefix: list[int], call: Callable[[], tuple[T, dict]]) -> tuple[T, dict]:
        """An engine call on this prefix, through the prefix cache: restored from it when held
        there, put into it after a fresh prefill."""
        hit = self._restore_cached(prefix)
        result, stats = call()
        if not hit and self.cache.worth_caching(prefix) and stats["prefix_reused"] == 0:
            self.cache.put(prefix, self.core.get_prefix_state(), self.core.get_prefix_logits())
        stats["prefix_cache_hit"] = hit
        return result, stats

    def _score(self, prefix: list[int], suffixes: list[list[int]]) -> tuple[Any, Any, dict]:
        def call() -> tuple[tuple[Any, Any], dict]:
            logits, lse, stats = self.core.score(
                prefix, suffixes, self.letter_ids, self.branch_mode
            )
            return (logits, lse), stats

        (logits, lse), stats = self._cached(prefix, call)
        return logits, lse, stats

    def tree_for(self, n: int) -> LabelTree:
        return self.trees.for_count(n)

    def _single_option(self, q: Question) -> Scored:
        """One option: probability 1 whatever the model would say, so it is not asked."""
        rendered = self._render(q)
        return Scored(
            question=q,
            option_logits=np.zeros(1),
            probabilities=np.ones(1),
            allowed_token_mass=1.0,
            input_tokens=0,
            prompt=rendered.text,
            readout=SINGLE_OPTION,
            prompt_version=None,
        )

    def _plan_group(
        self,
        questions: list[Question],
        rendered: list[RenderedPrompt],
        fulls: list[list[int]],
        head: str,
    ) -> GroupPlan:
        """Questions whose prompts share one head, planned by their readout's planner (one
        readout per prompt head: worker.py); _evaluate_group evaluates the plan the same way."""
        readout = questions[0].readout
        if readout == DELIBERATE:
            return self._plan_deliberate_group(questions, rendered, fulls, head)
        if readout != LETTERS:  # continuation, direct (readouts.py)
            return self._plan_readout_group(questions, rendered, fulls, head)
        return self._plan_letters_group(questions, rendered, fulls, head)

    def _plan_letters_group(
        self,
        questions: list[Question],
        rendered: list[RenderedPrompt],
        fulls: list[list[int]],
        head: str,
    ) -> GroupPlan:
        """Letters (label trees past 26 options): the split after the state (empty when it
        is not proven: each prompt then goes whole), the trees and the tokens it evaluates."""
        state_tokens = self.tokenize_prompt(head)
        prefix, boundary = self.split(state_tokens, fulls)
        trees = [
            self.tree_for(len(q.descriptions))
            if self.labels_for(len(q.descriptions)) is NUMBER_LABELS
            else None
            for q in questions
        ]
        tree_tokens = sum(t.nodes for t in trees if t is not None)
        if prefix:
            evaluated = len(prefix) + sum(len(f) - len(prefix) for f in fulls) + tree_tokens
        else:
            evaluated = sum(len(f) for f in fulls) + tree_tokens
        return GroupPlan(
            questions, rendered, fulls, state_tokens, prefix, boundary, trees, evaluated
        )

    def _evaluate_group(self, plan: GroupPlan) -> tuple[list[Scored], dict[str, Any]]:
        """A plan of _plan_group, by the planner that made it."""
        if plan.questions[0].readout == DELIBERATE:
            return self._evaluate_deliberate_group(plan)
        if plan.reads is not None:
            return self._evaluate_readout_group(plan)
        return self._evaluate_letters_group(plan)

    def _evaluate_letters_group(self, plan: GroupPlan) -> tuple[list[Scored], dict[str, Any]]:
        questions, rendered, fulls = plan.questions, plan.rendered, plan.fulls
        prefix, boundary, trees, state_tokens = (
            plan.prefix,
            plan.boundary,
            plan.trees,
            plan.state_tokens,
        )
        rows: list[Any] = [None] * len(questions)  # per question: (row, logsumexp, first)
        if prefix:
            suffixes = [f[len(prefix) :] for f in fulls]
            lettered = [i for i, t in enumerate(trees) if t is None]
            stats: dict[str, Any] = {}
            if lettered:
                logits, lse, stats = self._score(prefix, [suffixes[i] for i in lettered])
                for k, i in enumerate(lettered):
                    rows[i] = (logits[k], float(lse[k]), None)
            for i, tree in enumerate(trees):
                if tree is not None:
                    rows[i], more = self._cached(
                        prefix, lambda i=i, tree=tree: self._score_tree(prefix, suffixes[i], tree)
                    )
                    stats = add_stats(stats, more)
            group_timing = timing(
                "shared_prefix",
                proven=True,
                prefix_tokens=len(prefix),
                boundary=boundary,
                alignment=len(state_tokens) - boundary - len(prefix),
                reused=stats["prefix_reused"],
                cache_hit=stats["prefix_cache_hit"],
                prefill_seconds=stats["prefill_seconds"],
                suffix_tokens=stats["suffix_tokens"],
                suffix_seconds=stats["suffix_seconds"],
            )
        else:
            # The state's tokens are not a clean prefix of every prompt (a merge across the
            # boundary): evaluate each prompt whole rather than trust a wrong split.
            prefill = 0.0
            for i, (f, tree) in enumerate(zip(fulls, trees)):
                if tree is None:
                    logits, lse, stats = self.core.score(f, [[]], self.letter_ids)
                    rows[i] = (logits[0], float(lse[0]), None)
                else:
                    rows[i], stats = self._score_tree(f, [], tree)
                prefill += stats["prefill_seconds"] + stats["suffix_seconds"]
            group_timing = timing("full_evaluation", boundary=boundary, prefill_seconds=prefill)
        scored = []
        for q, r, f, tree, (row, lse_value, first) in zip(questions, rendered, fulls, trees, rows):
            option_logits = np.asarray(row[: len(q.descriptions)], dtype=np.float64)
            labels = self.labels_for(len(q.descriptions))
            scored.append(
                Scored(
                    question=q,
                    option_logits=option_logits,
                    probabilities=readout.softmax(
                        option_logits
                        if q.log_position_prior is None
                        else option_logits - np.asarray(q.log_position_prior, np.float64),
                        q.temperature,
                    ),
                    allowed_token_mass=readout.allowed_token_mass(option_logits, lse_value),
                    input_tokens=len(f),
                    prompt=r.text,
                    readout=LETTER_READOUT if tree is None else SEQUENCE_READOUT,
                    prompt_version=labels.prompt_version,
                    first_token_logits=first,
                )
            )
        return scored, group_timing

    def _score_tree(
        self, prefix: list[int], suffix: list[int], tree: LabelTree
    ) -> tuple[tuple[np.ndarray, float, np.ndarray], dict[str, Any]]:
        """A numbered question: its options' label-sequence log-probabilities (the row), 0 as
        their logsumexp (they are normalised already), and the first tokens' raw logits."""
        root, root_lse, nodes, node_lse, stats = self.core.score_tree(
            prefix, suffix, tree.tokens, tree.parent, tree.ids, tree.root_ids
        )
        logprobs = tree.logprobs(root, root_lse, nodes, node_lse)
        first = np.asarray(
            [root[tree.first_token_index(i)] for i in range(len(tree.sequences))], np.float64
        )
        return (logprobs, 0.0, first), stats

"""How the engine scores a prompt head of continuation or direct questions (issue #35): the
same proven, aligned prefix split as letters (scoring.py), the same restore-mode branches on
sequence 0, other tokens read.

- continuation: every option (continuation.py) is a branch after the state, read at each of
  its positions: each token's log-probability at the position before it.
- direct: one branch per question, as a lettered question; the rows are read for the answer
  words' single-token spellings (direct.py) instead of letters.
- deliberate: its own module (deliberate.py), dispatched from here.

Every row is the one-piece evaluation's (tests/test_readouts.py holds it to the bit). A part of
DecisionEngine (worker.py), which holds what these read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from semif_proxy import readout
from semif_proxy.engine import continuation, direct, prefix_split
from semif_proxy.engine.continuation import ContinuationRead
from semif_proxy.engine.questions import (
    CONTINUATION,
    CONTINUATION_READOUT,
    DELIBERATE,
    DIRECT_LEVELS_READOUT,
    DIRECT_YES_NO_READOUT,
    GroupPlan,
    Question,
    Scored,
    timing,
)
from semif_proxy.engine.readout_prompts import (
    CONTINUATION_PROMPT,
    YES_NO_PROMPT,
    ReadoutPrompt,
    direct_kind,
    render,
)
from semif_proxy.errors import InvalidRequest, PayloadTooLarge

if TYPE_CHECKING:
    from collections.abc import Callable

    from semif_proxy.engine import native
    from semif_proxy.engine.prompt import ChatTemplate, RenderedPrompt
    from semif_proxy.settings import Settings

Words = tuple[tuple[int, ...], ...]  # per option: its answer word's single-token spellings


class ReadoutScoring:
    core: native.Engine
    settings: Settings
    template: ChatTemplate
    branch_mode: str
    _word_ids: dict[str, tuple[int, ...]]

    def tokenize_prompt(self, text: str) -> list[int]: ...  # TokenChecks
    def split(self, state_tokens: list[int], fulls: Sequence[list[int]]) -> Any: ...
    def _cached(self, prefix: list[int], call: Callable[[], Any]) -> Any: ...  # GroupScoring

    if TYPE_CHECKING:  # DeliberateScoring's, later in DecisionEngine's bases

        def _render_deliberate(self, q: Question) -> RenderedPrompt: ...
        def _check_deliberate(self, q: Question) -> None: ...

    def _tokenize_text(self, text: str) -> list[int]:
        return list(self.core.tokenize(text, add_special=False, parse_special=False))

    def readout_prompt(self, q: Question) -> ReadoutPrompt:
        if q.readout == CONTINUATION:
            return CONTINUATION_PROMPT
        return direct_kind(q.answers or ())

    def _render_readout(self, q: Question) -> RenderedPrompt:
        if q.readout == DELIBERATE:
            return self._render_deliberate(q)
        return render(
            self.template, self.readout_prompt(q), q.state, q.question, q.descriptions, q.answers
        )

    def _word(self, word: str) -> tuple[int, ...]:
        if word not in self._word_ids:
            self._word_ids[word] = direct.word_tokens(word, self._tokenize_text)
        return self._word_ids[word]

    def _check_readout(self, q: Question) -> None:
        """What the readout needs of a question, refused before any forward pass (400 naming
        the field): a continuation's texts, a direct question's answer words."""
        if q.readout == DELIBERATE:
            self._check_deliberate(q)
            return
        if q.readout == CONTINUATION:
            for i, d in enumerate(q.descriptions):
                if not d.strip():
                    raise InvalidRequest(
                        f"{q.path}.options[{i}].description: the continuation readout scores "
                        "each option's description as the answer; this one is empty",
                        field=f"{q.path}.options[{i}].description",
                    )
            return
        answers = q.answers or ()
        if len(answers) != len(q.descriptions):
            raise InvalidRequest(
                f"{q.path}.readout: direct reads yes/no and score questions only",
                field=f"{q.path}.readout",
            )
        words = [self._word(a) for a in answers]
        for a, ids in zip(answers, words):
            if not ids:
                raise InvalidRequest(
                    f"{q.path}.readout: direct cannot read the answer {a!r}: no spelling of it "
                    "is one token for this model; use readout letters or continuation",
                    field=f"{q.path}.readout",
                )
        both = direct.shared(words)
        if both is not None:
            raise InvalidRequest(
                f"{q.path}.readout: two answers share the tokens {list(both)}; direct cannot "
                "tell them apart",
                field=f"{q.path}.readout",
            )

    def _check_answer_tokens(self, q: Question, tokens: int) -> None:
        limit = self.settings.prompt_token_limit
        if tokens > limit:
            raise PayloadTooLarge(
                f"{q.path}: the prompt with its longest option as the answer is {tokens} tokens, "
                f"over the limit of {limit} (SEMIF_MAX_PROMPT_TOKENS, else the engine's context: "
                "SEMIF_CTX_SIZE); shorten the state or the option descriptions, or raise the "
                "context",
                field=q.path,
                tokens=tokens,
                limit=limit,
            )

    def _plan_readout_group(
        self,
        questions: list[Question],
        rendered: list[RenderedPrompt],
        fulls: list[list[int]],
        head: str,
    ) -> GroupPlan:
        """As letters (scoring.py), and per continuation question the prefix its options go
        after: the shared state, or its own prompt's aligned head where that costs fewer
        tokens (an option is evaluated as the prompt's tokens after the prefix plus its own:
        after the state each option repeats the criterion and the option list)."""
        state_tokens = self.tokenize_prompt(head)
        prefix, boundary = self.split(state_tokens, fulls)
        reads: list[Read] = []
        evaluated = 0
        shared = False
        for q, r, f in zip(questions, rendered, fulls):
            if q.readout != CONTINUATION:
                reads.append(Read(tuple(self._word(a) for a in q.answers or ()), len(prefix)))
                evaluated += len(f) - len(prefix)
                shared = True
                continue
            conts = [
                continuation.answer_tokens(f, d, self.tokenize_prompt, r.text, self._tokenize_text)
                for d in q.descriptions
            ]
            read = continuation.plan(conts)
            self._check_answer_tokens(q, len(f) + read.longest())
            n = len(read.conts)
            own = prefix_split.aligned_length(len(f) - 1, self.core.cell_align)
            after_state = n * (len(f) - len(prefix))
            after_own = own + n * (len(f) - own)
            start = own if after_own < after_state else len(prefix)
            shared = shared or start == len(prefix)
            reads.append(Read(read, start))
            evaluated += (own if start == own else 0) + n * (len(f) - start) + read.extra_tokens()
        evaluated += len(prefix) if shared else 0
        return GroupPlan(
            questions, rendered, fulls, state_tokens, prefix, boundary, [None] * len(questions),
            evaluated, reads,
        )  # fmt: skip

    def _evaluate_readout_group(self, plan: GroupPlan) -> tuple[list[Scored], dict[str, Any]]:
        assert plan.reads is not None
        # Every evaluation, by the prefix it goes after: -1 the shared state's (with no proven
        # split: each one whole, in one piece), i question i's own prompt head. Each is
        # (question, suffix, rows read at its last positions).
        calls: dict[int, list[tuple[int, list[int], int]]] = {}
        for i, (f, read) in enumerate(zip(plan.fulls, plan.reads)):
            own = f[read.start :]
            if isinstance(read.what, ContinuationRead):
                wanted = [
                    ([*own, *h], n) for h, n in zip(read.what.heads(), read.what.rows())
                ]  # fmt: skip
            else:
                wanted = [(list(own), 1)]
            calls.setdefault(i if read.start != len(plan.prefix) else -1, []).extend(
                (i, suffix, n) for suffix, n in wanted
            )
        # Per question, per evaluation: its rows (the logits read, by token, and the logsumexp).
        rows: list[list[list[tuple[dict[int, float], float]]]] = [[] for _ in plan.questions]
        totals = {"prefill_seconds": 0.0, "suffix_seconds": 0.0, "suffix_tokens": 0}
        shared_stats: dict[str, Any] = {}
        for key, branches in calls.items():
            ids = sorted({t for i, _, _ in branches for t in plan.reads[i].ids()})
            suffixes = [s for _, s, _ in branches]
            outputs = [n for _, _, n in branches]
            whole = key == -1 and not plan.prefix
            if whole:
                # No proven split: each evaluation whole, from an empty state (restore mode
                # evaluates a suffix after an empty prefix in one piece).
                logits, lse, stats = self.core.score([], suffixes, ids, "restore", outputs)
            else:
                head = plan.prefix if key == -1 else plan.fulls[key][: plan.reads[key].start]
                call = partial(self._score_ids, head, suffixes, ids, outputs)
                (logits, lse), stats = self._cached(head, call)
            at = 0
            for i, _, n in branches:
                rows[i].append(
                    [(dict(zip(ids, logits[at + k])), float(lse[at + k])) for k in range(n)]
                )
                at += n
            if whole:
                # Whole prompts, as letters count them (scoring.py): prefill, no suffix.
                totals["prefill_seconds"] += stats["prefill_seconds"] + stats["suffix_seconds"]
                continue
            for name in totals:
                totals[name] += stats[name]
            if key == -1:
                shared_stats = stats
        group_timing = timing(
            "shared_prefix" if plan.prefix else "full_evaluation",
            proven=bool(plan.prefix),
            prefix_tokens=len(plan.prefix),
            boundary=plan.boundary,
            alignment=(len(plan.state_tokens) - plan.boundary - len(plan.prefix))
            if plan.prefix
            else 0,
            reused=shared_stats.get("prefix_reused", 0),
            cache_hit=shared_stats.get("prefix_cache_hit", False),
            prefill_seconds=totals["prefill_seconds"],
            suffix_tokens=int(totals["suffix_tokens"]),
            suffix_seconds=totals["suffix_seconds"],
        )
        scored = [
            self._scored(q, r, f, read.what, rows[i])
            for i, (q, r, f, read) in enumerate(
                zip(plan.questions, plan.rendered, plan.fulls, plan.reads)
            )
        ]
        return scored, group_timing

    def _score_ids(
        self, head: list[int], suffixes: list[list[int]], ids: list[int], outputs: list[int]
    ) -> tuple[tuple[Any, Any], dict]:
        logits, lse, stats = self.core.score(head, suffixes, ids, self.branch_mode, outputs)
        return (logits, lse), stats

    def _scored(
        self,
        q: Question,
        r: RenderedPrompt,
        f: list[int],
        what: ContinuationRead | Words,
        rows: list[list[tuple[dict[int, float], float]]],
    ) -> Scored:
        if isinstance(what, ContinuationRead):
            sums = continuation.sum_logprobs(what, rows)
            z = continuation.normalise(sums, what, q.normalization)
            mass = float(np.exp(np.logaddexp.reduce(sums)))
            name, version = CONTINUATION_READOUT, CONTINUATION_PROMPT.version
        else:
            z = direct.word_logprobs(*rows[0][0], what)
            mass = float(np.exp(np.logaddexp.reduce(z)))
            prompt = self.readout_prompt(q)
            name = DIRECT_YES_NO_READOUT if prompt is YES_NO_PROMPT else DIRECT_LEVELS_READOUT
            version = prompt.version
        return Scored(
            question=q,
            option_logits=z,
            probabilities=probabilities(q, z),
            allowed_token_mass=min(1.0, mass),
            input_tokens=len(f),
            prompt=r.text,
            readout=name,
            prompt_version=version,
        )


@dataclass(frozen=True)
class Read:
    """What a question reads (its continuations, or its answer words' tokens) and where its
    evaluations start: after that many of its prompt's tokens (the shared state's, or its
    own)."""

    what: ContinuationRead | Words
    start: int

    def ids(self) -> list[int]:
        if isinstance(self.what, ContinuationRead):
            return self.what.targets
        return [t for word in self.what for t in word]


def probabilities(q: Question, z: np.ndarray) -> np.ndarray:
    """The softmax of a question's log-scores, its position prior (if any) taken off."""
    if q.log_position_prior is not None:
        z = z - np.asarray(q.log_position_prior, np.float64)
    return readout.softmax(z, q.temperature)

"""The exactness self-check at load: a decision split as requests are served must give the
letter logits of its one-piece prompt on the libllama this process runs."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from semif_proxy.engine import prefix_split
from semif_proxy.engine.prompt import render_decision

if TYPE_CHECKING:
    from semif_proxy.engine.worker import DecisionEngine

# The sample: two questions on one state, each with two short options. Short on purpose: the
# check runs at every start (and ~80 times in the test suite), and what it tests, where the
# cells of a held prefix and of each question's branch land, does not depend on the text; the
# routing example it replaced took 545 evaluated tokens on SmolLM2, this one 340.
STATE = "Ticket: the login fails."
QUESTIONS = ("Which queue?", "Which team?")
OPTIONS = ("Billing", "Login")
SAMPLE_GROWTH = 16  # the most times the state is repeated to fill one cell block

# Letter logits of a split evaluation may differ from the one-piece evaluation by this much when
# layers run on a GPU (its kernels are not bit-exact); on the CPU they must be identical.
GPU_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ExactnessCheck:
    """The start-up comparison of a split evaluation (as requests are served) with the one-piece
    evaluation of the same prompts, on the libllama this process runs."""

    passed: bool
    max_abs_difference: float  # over every letter logit of every sample prompt
    tolerance: float
    prefix_tokens: int
    suffix_tokens: list[int]
    branch_mode: str
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sample(engine: DecisionEngine) -> tuple[list[list[int]], list[int]]:
    """The sample's two prompts, and the prefix they are split at: the state's proven aligned
    split, else their common tokens aligned. The state is repeated until the prefix holds at
    least one cell block: cells align to 64 where llama.cpp reports AVX-512 (the base image's
    CPU variants on such a host; 8 or 32 otherwise), and a prefix that aligns down to nothing
    would check nothing."""
    align = engine.core.cell_align
    state = STATE
    for _ in range(SAMPLE_GROWTH):
        rendered = [render_decision(engine.template, state, q, list(OPTIONS)) for q in QUESTIONS]
        fulls = [engine.tokenize_prompt(r.text) for r in rendered]
        prefix, _ = prefix_split.split(
            engine.tokenize_prompt(rendered[0].state_prefix), fulls, align
        )
        if not prefix:  # no proven split of this state: check on the prompts' common tokens
            common = prefix_split.shared_prefix(fulls[0], fulls)
            prefix = common[: prefix_split.aligned_length(len(common), align)]
        if prefix:
            break
        state = f"{state} {STATE}"
    return fulls, prefix


def check(engine: DecisionEngine) -> ExactnessCheck:
    """Score the sample's prompts split (aligned prefix, then each question's suffix, as
    requests are served) and whole (each prompt in one piece, as llama-server
    evaluates it), and compare every letter logit. The promise that a decision gets the
    numbers of its whole prompt rests on where this libllama places KV cells; a build
    that places them differently (the container links the base image's own) is caught
    here, at load, instead of answering with numbers that depend on batching."""
    start = time.perf_counter()
    fulls, prefix = _sample(engine)
    tolerance = GPU_TOLERANCE if engine.offloaded else 0.0
    if not prefix:  # no split at all, for this template: every decision goes whole
        return ExactnessCheck(True, 0.0, tolerance, 0, [], engine.branch_mode, 0.0)
    suffixes = [f[len(prefix) :] for f in fulls]
    engine.core.reset()
    # The prefix first, alone: every question is then decoded after a held prefix, the path
    # whose cell placement is in question (a first question evaluated together with a fresh
    # prefix is a one-piece evaluation by construction).
    engine.core.score(prefix, [[]], engine.letter_ids)
    split, _, _ = engine.core.score(prefix, suffixes, engine.letter_ids, engine.branch_mode)
    whole = []
    for full in fulls:
        engine.core.reset()
        logits, _, _ = engine.core.score(full, [[]], engine.letter_ids)
        whole.append(logits[0])
    engine.core.reset()
    difference = float(
        np.max(np.abs(np.asarray(split, np.float64) - np.asarray(whole, np.float64)))
    )
    return ExactnessCheck(
        passed=bool(difference <= tolerance),  # NaN fails
        max_abs_difference=difference,
        tolerance=tolerance,
        prefix_tokens=len(prefix),
        suffix_tokens=[len(s) for s in suffixes],
        branch_mode=engine.branch_mode,
        seconds=time.perf_counter() - start,
    )

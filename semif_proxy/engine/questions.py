"""What the engine takes and gives: a `Question` (one decision as the engine sees it), its
`Scored` row, a request's `Evaluation`, and the timing every answer reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from semif_proxy.settings.defaults import (
    DEFAULT_BIAS_CORRECTION,
    DEFAULT_DELIBERATION_TOKENS,
    DEFAULT_NORMALIZATION,
    DEFAULT_READOUT,
)

if TYPE_CHECKING:
    from semif_proxy.engine.label_tree import LabelTree
    from semif_proxy.engine.prompt import RenderedPrompt

# What an answer's numbers are (named in every answer as `readout`).
LETTER_READOUT = "letter-logits"
SEQUENCE_READOUT = "label-sequence-logprobs"
SINGLE_OPTION = "single-option"  # probability 1, no model call
CONTINUATION_READOUT = "continuation-logprobs"  # each option's text scored as the answer
DIRECT_YES_NO_READOUT = "direct-yes-no"  # the model's own yes/no tokens
DIRECT_LEVELS_READOUT = "direct-levels"  # the model's own level-number tokens
DELIBERATE_READOUT = "deliberate-letter-logits"  # letters after the model's own reasoning

# What a question asks to be read by (the API's `readout`, `normalization`, `bias_correction`).
LETTERS = "letters"
CONTINUATION = "continuation"
DIRECT = "direct"
DELIBERATE = "deliberate"
READOUTS = (LETTERS, CONTINUATION, DIRECT, DELIBERATE)
NORMALIZATIONS = ("sum", "mean", "pmi")
BIAS_CORRECTIONS = ("none", "contextual", "batch")


@dataclass(frozen=True)
class Question:
    """One decision as the engine sees it: where it came from, what it asks, how to score it."""

    path: str  # request field path, for error messages ("decisions[2]")
    id: str
    state: Any
    question: str
    descriptions: tuple[str, ...]
    temperature: float = 1.0
    return_prompt: bool = False
    # Log of the model's prior on each listed position (PriDe), subtracted from the option
    # logits before the softmax; None: no prior. Raw option logits are reported unchanged.
    log_position_prior: tuple[float, ...] | None = None
    # How the options are read (readouts.py): "letters" (the labels' logits, as always),
    # "continuation" (each description scored as the answer text, normalised "sum", "mean" or
    # "pmi") or "direct" (the model's own answer words: `answers`, per listed option, "yes" /
    # "no" or a level number). `bias_correction` "contextual" divides the same readout's answer
    # distribution after a content-free state out of the probabilities (bias.py).
    readout: str = DEFAULT_READOUT
    normalization: str = DEFAULT_NORMALIZATION
    bias_correction: str = DEFAULT_BIAS_CORRECTION
    answers: tuple[str, ...] | None = None
    # "deliberate" (deliberate.py): the most tokens the model writes before its letters are
    # read, and whether the answer returns that text.
    deliberation_tokens: int = DEFAULT_DELIBERATION_TOKENS
    return_reasoning: bool = False

    @property
    def position_prior(self) -> str:
        """What every answer reports: `applied` when a fitted prior is divided out of this
        question's probabilities, `none` otherwise."""
        return "applied" if self.log_position_prior else "none"


@dataclass
class Scored:
    """One question's numbers. `option_logits` is the log-score the probabilities are the
    softmax of (before the position prior and the temperature):
    - letters: each letter's raw logit; numbers: each label sequence's log-probability;
    - continuation: the description's log-probability as the answer, summed over its tokens
      ("sum"), per token ("mean"), or summed less its log-probability after a content-free
      state ("pmi");
    - direct: log P(the option's answer word), its single-token spellings summed.
    With contextual bias correction the probabilities are softmax(option_logits -
    content_free_logits): the content-free answer distribution divided out; with batch
    correction, the served probabilities divided by batch_mean_probabilities, renormalised."""

    question: Question
    option_logits: np.ndarray
    probabilities: np.ndarray
    allowed_token_mass: float
    input_tokens: int
    prompt: str
    readout: str = LETTER_READOUT
    prompt_version: str | None = None
    # Numbers: the raw logit of each option's first label token at the prompt's last position.
    first_token_logits: np.ndarray | None = None
    # Contextual bias correction: the same readout's option_logits after a content-free state.
    content_free_logits: np.ndarray | None = None
    # Batch correction (batch_bias.py): its batch's mean probabilities, and how many it held.
    batch_mean_probabilities: np.ndarray | None = None
    batch_size: int | None = None
    # Deliberate: what the model wrote before its letters were read.
    deliberation: Deliberation | None = None


@dataclass(frozen=True)
class Deliberation:
    """A deliberate question's reasoning: the text the model wrote (greedy), its token count,
    and whether its end of turn ended it (else the budget did)."""

    tokens: int
    text: str
    ended: bool


@dataclass(frozen=True)
class GroupPlan:
    """The questions of a request that share one prompt head, ready to evaluate."""

    questions: list[Question]
    rendered: list[RenderedPrompt]
    fulls: list[list[int]]
    state_tokens: list[int]
    prefix: list[int]  # the proven, aligned split; empty: each prompt whole
    boundary: int
    trees: list[LabelTree | None]  # per question: its label tree (numbers) or None (letters)
    evaluated: int  # tokens the group evaluates
    # Continuation and direct groups: per question, what readouts.py reads for it.
    reads: list[Any] | None = None


@dataclass
class Evaluation:
    scored: list[Scored]
    timing: dict[str, Any] = field(default_factory=dict)
    evaluated_tokens: int = 0


def timing(
    mode: str,
    *,
    proven: bool = False,
    prefix_tokens: int = 0,
    boundary: int = 0,
    alignment: int = 0,
    reused: int = 0,
    cache_hit: bool = False,
    prefill_seconds: float = 0.0,
    suffix_tokens: int = 0,
    suffix_seconds: float = 0.0,
) -> dict[str, Any]:
    """One prompt head's timing block, the same keys in every mode (answers report it)."""
    return {
        "mode": mode,
        "prefix_proven": proven,
        "prefix_tokens": prefix_tokens,
        "prefix_boundary_tokens": boundary,
        "prefix_alignment_tokens": alignment,
        "prefix_reused_tokens": reused,
        "prefix_cache_hit": cache_hit,
        "prefill_seconds": prefill_seconds,
        "suffix_tokens": suffix_tokens,
        "suffix_seconds": suffix_seconds,
    }


# No prompt head evaluated: every question had one option.
NO_MODEL_TIMING: dict[str, Any] = {**timing("no_model_call"), "prompt_heads": 0}


def add_stats(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Stats of several engine calls on one prefix: seconds and tokens add up, the prefix was
    reused (or restored from the cache) as the first call found it."""
    if not total:
        return dict(more)
    out = dict(total)
    for key in ("prefill_seconds", "suffix_seconds", "suffix_tokens"):
        out[key] = total[key] + more[key]
    return out


def merge_timings(timings: list[dict[str, Any]]) -> dict[str, Any]:
    """One request's timing over its prompt heads (letters and numbers have their own)."""
    if len(timings) == 1:
        return {**timings[0], "prompt_heads": 1}
    out = dict(timings[0])
    if len({t["mode"] for t in timings}) > 1:
        out["mode"] = "mixed"
    for key in ("generated_tokens", "generation_seconds"):  # deliberate heads only
        if any(key in t for t in timings):
            out[key] = sum(t.get(key, 0) for t in timings)
    for key in (
        "prefix_tokens",
        "prefix_reused_tokens",
        "prefill_seconds",
        "suffix_tokens",
        "suffix_seconds",
    ):
        out[key] = sum(t[key] for t in timings)
    out["prefix_proven"] = all(t["prefix_proven"] for t in timings)
    out["prefix_cache_hit"] = any(t["prefix_cache_hit"] for t in timings)
    out["prompt_heads"] = len(timings)
    return out

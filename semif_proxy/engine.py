"""The decision engine worker: plain questions in, scored option rows and timing out.

It owns the native engine (`semif_proxy._engine`) and the one thread every call on it runs on
(a cancelled caller aborts its job), the prompt tokens (rendered by prompt.py, tokenized exactly
as llama-server tokenizes them), the checks that run before any forward pass (special tokens,
token budget), the shared-prefix split (its proof and its alignment), the prefix cache, and the
exactness self-check at load. It knows nothing of HTTP or of the APIs' request schemas: the
services (decisions.py, systemone.py) turn requests into `Question`s and rows into answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from semif_proxy import label_tree, native, readout
from semif_proxy.engine_thread import EngineThread
from semif_proxy.errors import (
    Cancelled,
    EngineFailure,
    InvalidRequest,
    PayloadTooLarge,
    Unavailable,
)
from semif_proxy.examples import ROUTING_OPTIONS, ROUTING_QUESTION, ROUTING_STATE
from semif_proxy.injection import SpecialTokenPolicy
from semif_proxy.label_tree import LabelTree
from semif_proxy.model_files import model_sha256
from semif_proxy.prefix_cache import PrefixCache
from semif_proxy.prompt import (
    NUMBER_LABELS,
    ChatTemplate,
    Labels,
    RenderedPrompt,
    check_letters,
    check_numbers,
    decision_messages,
    labels_for,
    render_decision,
)
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.engine")
T = TypeVar("T")
# Letter logits of a split evaluation may differ from the one-piece evaluation by this much when
# layers run on a GPU (its kernels are not bit-exact); on the CPU they must be identical.
GPU_TOLERANCE = 1e-3
# What an answer's numbers are (named in every answer as `readout`).
LETTER_READOUT = "letter-logits"
SEQUENCE_READOUT = "label-sequence-logprobs"
SINGLE_OPTION = "single-option"  # probability 1, no model call
NO_MODEL_TIMING: dict[str, Any] = {
    "mode": "no_model_call",
    "prefix_proven": False,
    "prefix_tokens": 0,
    "prefix_boundary_tokens": 0,
    "prefix_alignment_tokens": 0,
    "prefix_reused_tokens": 0,
    "prefix_cache_hit": False,
    "prefill_seconds": 0.0,
    "suffix_tokens": 0,
    "suffix_seconds": 0.0,
    "prompt_heads": 0,
}


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

    @property
    def position_prior(self) -> str:
        """What every answer reports: `applied` when a fitted prior is divided out of this
        question's probabilities, `none` otherwise."""
        return "applied" if self.log_position_prior else "none"


@dataclass
class Scored:
    question: Question
    # Letters: each letter's raw logit. Numbers: each label sequence's log-probability.
    option_logits: np.ndarray
    probabilities: np.ndarray
    allowed_token_mass: float
    input_tokens: int
    prompt: str
    readout: str = LETTER_READOUT
    prompt_version: str | None = None
    # Numbers: the raw logit of each option's first label token at the prompt's last position.
    first_token_logits: np.ndarray | None = None


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


@dataclass
class Evaluation:
    scored: list[Scored]
    timing: dict[str, Any] = field(default_factory=dict)
    evaluated_tokens: int = 0


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


def shared_prefix(state_tokens: Sequence[int], fulls: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix that the state's own tokens and every full prompt agree on, and
    that leaves each prompt at least one token to decode. This is the proof that one prefill
    serves every question: it *is* the start of each prompt, token for token."""
    limit = min([len(state_tokens)] + [len(f) - 1 for f in fulls])
    k = 0
    while k < limit and all(f[k] == state_tokens[k] for f in fulls):
        k += 1
    return list(state_tokens[:k])


def aligned_length(proven: int, cell_align: int) -> int:
    """Where the split goes: the proven prefix cut back to a multiple of the KV cell alignment,
    so the first suffix sits exactly where its tokens sit when the whole prompt is evaluated at
    once (and every other suffix on an aligned cell too, see engine.cpp). Splitting mid-chunk
    moved letter log-probs by up to 0.3 (measured on SmolLM2 over every split point of one
    prompt)."""
    return proven - proven % cell_align


class DecisionEngine:
    # BPE vocabularies often merge the state's closing quote with the comma that follows
    # ('",'); the split then moves back a token or two. Any further and the split is refused.
    boundary_slack = 4

    def __init__(
        self,
        core: native.Engine,
        settings: Settings,
        sha256: str,
        thread: EngineThread | None = None,
    ) -> None:
        self.core = core
        # Every forward pass on one thread (engine_thread.py), this constructor's own check too.
        # A thread passed in is shared with other engines of the process and outlives this one.
        self._owns_thread = thread is None
        self.thread = thread or EngineThread()
        self.settings = settings
        self.sha256 = sha256
        self.cache = PrefixCache(settings.prefix_cache_mb * 1024 * 1024)
        # On the CPU every question is decoded right after the prefix, one at a time, and its
        # cells are removed before the next ("restore"): its cells then lie exactly where a
        # one-piece evaluation puts them, whatever the model's attention kernels chunk by.
        # Branches batched side by side ("copy") sit after each other's masked cells; on
        # Qwen2.5-0.5B that moved probabilities by up to 0.014 against single requests (bench
        # `order`), and on a CPU it buys no speed (singles on a held prefix were as fast as a
        # batch). On a GPU batching pays and its kernels are not bit-exact anyway.
        self.offloaded = settings.n_gpu_layers != 0 and bool(native.gpu_devices())  # -1: all
        self.branch_mode = "copy" if self.offloaded else "restore"
        self._job_lock = threading.Lock()
        self._current_job: object | None = None
        self._abort_requested_at: float | None = None
        self.aborted_jobs = 0
        self.special_tokens = SpecialTokenPolicy(
            core.token_piece(token).decode("utf-8", "replace") for token in core.special_tokens()
        )
        self.max_token_bytes = max(
            1, max(len(core.token_piece(t, False)) for t in range(core.n_vocab))
        )
        bos_text = core.token_piece(core.bos).decode("utf-8", "replace") if core.bos >= 0 else ""
        eos_text = core.token_piece(core.eos).decode("utf-8", "replace") if core.eos >= 0 else ""
        self.template = ChatTemplate(core.chat_template, bos_text, eos_text, strip_bos=core.add_bos)
        sample = render_decision(self.template, "evidence", "criterion", ["first", "second"]).text
        check = check_letters(
            self.tokenize_prompt,
            lambda text: core.tokenize(text, add_special=False, parse_special=False),
            lambda token: core.token_piece(token).decode("utf-8", "replace"),
            sample,
        )
        self.letter_ids = list(check.token_ids)
        numbers_messages = decision_messages("evidence", "criterion", ["a", "b"], NUMBER_LABELS)
        self.numbers = check_numbers(
            self.tokenize_prompt,
            lambda text: core.tokenize(text, add_special=False, parse_special=False),
            self.template.render(numbers_messages),
            self.template.answer_end(numbers_messages, "1"),
            core.eos,
        )
        self.trees = label_tree.Trees(self.numbers.tokens, self.numbers.end)
        if self.numbers.reason:
            log.warning(
                "numbered labels unavailable",
                extra={"event": "number_check", "reason": self.numbers.reason},
            )
        self.unavailable_reason: str | None = None
        self.exactness: ExactnessCheck | None = None
        if not check.ok:
            self.unavailable_reason = "decisions are disabled for this model: " + "; ".join(
                check.problems[:5]
            )
            log.error(
                "letter check failed",
                extra={"event": "letter_check", "problems": list(check.problems)},
            )
        else:
            self.exactness = self.check_exactness()
            if not self.exactness.passed:
                self.unavailable_reason = (
                    "decisions are disabled: the exactness self-check failed on this libllama: "
                    f"a sample decision split as requests are served ({self.branch_mode}) gives "
                    "letter logits that differ from its one-piece evaluation by up to "
                    f"{self.exactness.max_abs_difference:.3g} (allowed "
                    f"{self.exactness.tolerance:g}; llama.cpp build "
                    f"{native.build_info()['llama_cpp_build']})"
                )
            log.log(
                logging.INFO if self.exactness.passed else logging.ERROR,
                "exactness self-check",
                extra={"event": "exactness_check", **self.exactness.as_dict()},
            )
        self.model_info = {
            "file": Path(core.model_path).name,
            "bytes": Path(core.model_path).stat().st_size,
            "sha256": sha256,
            "llama_cpp_build": native.build_info()["llama_cpp_build"],
            "n_gpu_layers": core.n_gpu_layers,
            "threads": core.n_threads,
            "ubatch": core.n_ubatch,  # tokens per llama_decode call (SEMIF_UBATCH_SIZE)
            "context_size": core.n_ctx,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def load(
        cls, settings: Settings, threads: int | None = None, thread: EngineThread | None = None
    ) -> DecisionEngine:
        """Load on `thread` (a new one when None, owned by the engine), where the engine will
        run: model load, self-check and every decision on one thread."""
        if settings.backend_dir is not None:
            native.load_backends(settings.backend_dir)
        owned = thread is None
        on = thread or EngineThread()

        def build() -> DecisionEngine:
            core = native.Engine(
                str(settings.model_path),
                n_ctx=settings.n_ctx,
                n_threads=threads or settings.threads.engine,
                n_gpu_layers=settings.n_gpu_layers,
                n_seq=settings.n_parallel,
                n_batch=settings.n_batch,
                n_ubatch=settings.engine_ubatch,
            )
            # Hashed once the file has loaded: a file that is no model is not read in full.
            engine = cls(core, settings, model_sha256(settings.model_path), on)
            engine._owns_thread = owned
            return engine

        try:
            return on.call(build)
        except BaseException:
            if owned:
                on.shutdown()
            raise

    @classmethod
    async def start(cls, settings: Settings, threads: int | None = None) -> DecisionEngine:
        return await asyncio.get_running_loop().run_in_executor(None, cls.load, settings, threads)

    def close(self) -> None:
        self.core.resume()  # a job parked by the CPU slicer must be able to end
        if self._owns_thread:
            self.thread.shutdown()

    # -- CPU time-slicing (cpu_slicer.py) ----------------------------------------------------

    @property
    def parks_quietly(self) -> bool:
        """A parked job's other compute threads sleep at the node's barrier: ggml's CPU backend
        uses OpenMP (its own threadpool would spin there, keeping the cores busy)."""
        return "OPENMP = 1" in str(native.build_info()["system_info"])

    @property
    def parks(self) -> int:
        return self.core.parks

    def pause(self) -> None:
        """Park the job in progress at its next graph node (and the next job at its first)."""
        self.core.pause()

    def resume(self) -> None:
        self.core.resume()

    # -- a dynamic split of the CPU (cpu_dynamic.py) -----------------------------------------

    def set_threads(self, n: int) -> None:
        """Threads for the engine's ubatches; 0: the count the engine was loaded with. A lower
        count preempts the ubatch in progress, which runs again on it; a higher one applies
        from the next ubatch (csrc/engine.h)."""
        self.core.set_threads(n)

    @property
    def preempts(self) -> int:
        """Ubatches preempted by a lower thread count and evaluated again."""
        return self.core.preempts

    @property
    def threads_now(self) -> int:
        """Threads of the ubatch in progress; 0 when none runs."""
        return self.core.threads_now

    @property
    def job_running(self) -> bool:
        """A job is on the engine thread right now (queued ones are not counted)."""
        return self._current_job is not None

    async def run(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread; callers queue there in arrival order.

        A caller that is cancelled (its client hung up, its deadline passed) takes its work
        with it: a queued job never starts, a running one stops at the next graph node, so the
        next request starts at once instead of after a prefill nobody will read."""
        job = object()
        future = asyncio.get_running_loop().run_in_executor(
            self.thread.executor, self._job, job, fn
        )
        try:
            return await future
        except asyncio.CancelledError:
            self._abort(job)
            raise

    def _job(self, job: object, fn: Callable[[], T]) -> T:
        with self._job_lock:
            self._current_job = job
            self._abort_requested_at = None
            self.core.clear_abort()
        try:
            return fn()
        finally:
            with self._job_lock:
                self._current_job = None
                if self._abort_requested_at is not None:
                    late = time.monotonic() - self._abort_requested_at
                    log.info(
                        "aborted engine job ended",
                        extra={"event": "engine_job_stopped", "after_abort_seconds": late},
                    )

    def _abort(self, job: object) -> None:
        with self._job_lock:
            if self._current_job is job:
                self.core.abort()
                self.aborted_jobs += 1
                self._abort_requested_at = time.monotonic()
                log.info("engine job aborted", extra={"event": "engine_abort"})

    # -- tokens ------------------------------------------------------------------------------

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

    # -- budget --------------------------------------------------------------------------------

    def _check_limits(self, questions: Sequence[Question], fulls: Sequence[list[int]]) -> None:
        limit = self.settings.prompt_token_limit
        for q, tokens in zip(questions, fulls):
            if len(tokens) > limit:
                raise PayloadTooLarge(
                    f"{q.path}: the prompt is {len(tokens)} tokens, over the limit of {limit}",
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

    # -- the split -------------------------------------------------------------------------------

    def split(self, state_tokens: list[int], fulls: Sequence[list[int]]) -> tuple[list[int], int]:
        """The aligned prefix every prompt shares (empty when no split can be trusted) and the
        boundary: how many of the state's own tokens the proof lost to a merge at its end."""
        proof = shared_prefix(state_tokens, fulls)
        boundary = len(state_tokens) - len(proof)
        if boundary > self.boundary_slack:
            return [], boundary
        return proof[: aligned_length(len(proof), self.core.cell_align)], boundary

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

    # -- exactness -------------------------------------------------------------------------------

    def check_exactness(self) -> ExactnessCheck:
        return self.thread.call(self._check_exactness)

    def _check_exactness(self) -> ExactnessCheck:
        """Score the routing example's prompts split (aligned prefix, then each question's
        suffix, as requests are served) and whole (each prompt in one piece, as llama-server
        evaluates it), and compare every letter logit. The promise that a decision gets the
        numbers of its whole prompt rests on where this libllama places KV cells; a build
        that places them differently (the container links the base image's own) is caught
        here, at load, instead of answering with numbers that depend on batching."""
        start = time.perf_counter()
        descriptions = [d for _, d in ROUTING_OPTIONS]
        questions = [ROUTING_QUESTION, "Which team owns this?"]
        rendered = [
            render_decision(self.template, ROUTING_STATE, q, descriptions) for q in questions
        ]
        fulls = [self.tokenize_prompt(r.text) for r in rendered]
        prefix, _ = self.split(self.tokenize_prompt(rendered[0].state_prefix), fulls)
        if not prefix:  # no proven split of this state: check on the prompts' common tokens
            common = shared_prefix(fulls[0], fulls)
            prefix = common[: aligned_length(len(common), self.core.cell_align)]
        tolerance = GPU_TOLERANCE if self.offloaded else 0.0
        if not prefix:  # nothing to split (prompts shorter than one cell block): all go whole
            return ExactnessCheck(True, 0.0, tolerance, 0, [], self.branch_mode, 0.0)
        suffixes = [f[len(prefix) :] for f in fulls]
        self.core.reset()
        # The prefix first, alone: every question is then decoded after a held prefix, the path
        # whose cell placement is in question (a first question evaluated together with a fresh
        # prefix is a one-piece evaluation by construction).
        self.core.score(prefix, [[]], self.letter_ids)
        split, _, _ = self.core.score(prefix, suffixes, self.letter_ids, self.branch_mode)
        whole = []
        for full in fulls:
            self.core.reset()
            logits, _, _ = self.core.score(full, [[]], self.letter_ids)
            whole.append(logits[0])
        self.core.reset()
        difference = float(
            np.max(np.abs(np.asarray(split, np.float64) - np.asarray(whole, np.float64)))
        )
        return ExactnessCheck(
            passed=bool(difference <= tolerance),  # NaN fails
            max_abs_difference=difference,
            tolerance=tolerance,
            prefix_tokens=len(prefix),
            suffix_tokens=[len(s) for s in suffixes],
            branch_mode=self.branch_mode,
            seconds=time.perf_counter() - start,
        )

    # -- evaluation (engine thread) ------------------------------------------------------------

    def evaluate(self, questions: Sequence[Question]) -> Evaluation:
        """Score questions that share one state: one prefill per prompt head (letters and
        numbers have their own system text), the questions as branches. A question with one
        option is answered without the model. On the engine thread, whoever calls."""
        return self.thread.call(lambda: self._evaluate(questions))

    def _evaluate(self, questions: Sequence[Question]) -> Evaluation:
        if self.unavailable_reason:
            raise Unavailable(self.unavailable_reason)
        start = time.perf_counter()
        self._check_special_tokens(questions)
        asked = [i for i, q in enumerate(questions) if len(q.descriptions) > 1]
        for i in asked:
            self._check_label_scheme(questions[i])
        scored: list[Scored | None] = [None] * len(questions)
        timing: dict[str, Any] = dict(NO_MODEL_TIMING)
        evaluated = 0
        if asked:
            self._check_budget([questions[i] for i in asked])
            rendered = {i: self._render(questions[i]) for i in asked}
            groups: dict[str, list[int]] = {}
            for i in asked:
                groups.setdefault(rendered[i].state_prefix, []).append(i)
            timings = []
            fulls = {i: self.tokenize_prompt(rendered[i].text) for i in asked}
            self._check_limits([questions[i] for i in asked], [fulls[i] for i in asked])
            plans = [
                self._plan_group(
                    [questions[i] for i in members],
                    [rendered[i] for i in members],
                    [fulls[i] for i in members],
                    head,
                )
                for head, members in groups.items()
            ]
            # The whole request against its budget before any group's work starts.
            evaluated = sum(plan.evaluated for plan in plans)
            self._check_request_tokens(evaluated)
            for members, plan in zip(groups.values(), plans):
                group_scored, group_timing = self._evaluate_group(plan)
                for i, row in zip(members, group_scored):
                    scored[i] = row
                timings.append(group_timing)
            timing = merge_timings(timings)
        for i, q in enumerate(questions):
            if scored[i] is None:
                scored[i] = self._single_option(q)
        timing["forward_seconds"] = timing["prefill_seconds"] + timing["suffix_seconds"]
        timing["total_seconds"] = time.perf_counter() - start
        return Evaluation(
            scored=[s for s in scored if s is not None], timing=timing, evaluated_tokens=evaluated
        )

    def labels_for(self, n: int) -> Labels:
        return labels_for(n, self.settings.labels)

    def _render(self, q: Question) -> RenderedPrompt:
        labels = self.labels_for(len(q.descriptions))
        return render_decision(self.template, q.state, q.question, q.descriptions, labels)

    def _check_label_scheme(self, q: Question) -> None:
        if self.labels_for(len(q.descriptions)) is NUMBER_LABELS and self.numbers.reason:
            raise InvalidRequest(
                f"{q.path}.options: {len(q.descriptions)} options need numbered labels, which "
                f"this model cannot score: {self.numbers.reason}",
                field=f"{q.path}.options",
            )

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
        """Questions whose prompts share one head: the split after the state (empty when it is
        not proven: each prompt then goes whole) and the tokens the group evaluates."""
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
            timing = {
                "mode": "shared_prefix",
                "prefix_proven": True,
                "prefix_tokens": len(prefix),
                "prefix_boundary_tokens": boundary,
                "prefix_alignment_tokens": len(state_tokens) - boundary - len(prefix),
                "prefix_reused_tokens": stats["prefix_reused"],
                "prefix_cache_hit": stats["prefix_cache_hit"],
                "prefill_seconds": stats["prefill_seconds"],
                "suffix_tokens": stats["suffix_tokens"],
                "suffix_seconds": stats["suffix_seconds"],
            }
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
            timing = {
                "mode": "full_evaluation",
                "prefix_proven": False,
                "prefix_tokens": 0,
                "prefix_boundary_tokens": boundary,
                "prefix_alignment_tokens": 0,
                "prefix_reused_tokens": 0,
                "prefix_cache_hit": False,
                "prefill_seconds": prefill,
                "suffix_tokens": 0,
                "suffix_seconds": 0.0,
            }
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
        return scored, timing

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

    def evaluate_checked(self, questions: Sequence[Question]) -> Evaluation:
        """evaluate(), with llama.cpp failures turned into domain errors."""
        try:
            return self.evaluate(questions)
        except native.LlamaError as exc:
            if exc.code == native.ERR_ABORTED:
                raise Cancelled("the request was cancelled; its work was stopped") from None
            if exc.code == native.ERR_CONTEXT_OVERFLOW:
                raise PayloadTooLarge(
                    f"{exc}; shorten the state or raise SEMIF_CTX_SIZE",
                    field="body",
                    limit=self.core.n_ctx,
                ) from None
            log.error(
                "engine failure",
                extra={"event": "engine_error", "code": exc.code, "error": str(exc)},
            )
            raise EngineFailure(f"the decision engine failed: {exc}", code=exc.code) from None


__all__ = ["DecisionEngine", "Evaluation", "ExactnessCheck", "Question", "Scored"]

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from semif_proxy import native, readout
from semif_proxy.errors import (
    Cancelled,
    EngineFailure,
    PayloadTooLarge,
    Unavailable,
)
from semif_proxy.examples import ROUTING_OPTIONS, ROUTING_QUESTION, ROUTING_STATE
from semif_proxy.injection import SpecialTokenPolicy
from semif_proxy.model_files import model_sha256
from semif_proxy.prefix_cache import PrefixCache
from semif_proxy.prompt import ChatTemplate, check_letters, render_decision
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.engine")
T = TypeVar("T")
# Letter logits of a split evaluation may differ from the one-piece evaluation by this much when
# layers run on a GPU (its kernels are not bit-exact); on the CPU they must be identical.
GPU_TOLERANCE = 1e-3


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


@dataclass
class Scored:
    question: Question
    option_logits: np.ndarray
    probabilities: np.ndarray
    allowed_token_mass: float
    input_tokens: int
    prompt: str


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

    def __init__(self, core: native.Engine, settings: Settings, sha256: str) -> None:
        self.core = core
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semif-engine")
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
            "context_size": core.n_ctx,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def load(cls, settings: Settings, threads: int | None = None) -> DecisionEngine:
        if settings.backend_dir is not None:
            native.load_backends(settings.backend_dir)
        core = native.Engine(
            str(settings.model_path),
            n_ctx=settings.n_ctx,
            n_threads=threads or settings.threads.engine,
            n_gpu_layers=settings.n_gpu_layers,
            n_seq=settings.n_parallel,
            n_batch=settings.n_batch,
        )
        return cls(core, settings, model_sha256(settings.model_path))

    @classmethod
    async def start(cls, settings: Settings, threads: int | None = None) -> DecisionEngine:
        return await asyncio.get_running_loop().run_in_executor(None, cls.load, settings, threads)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

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
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._job, job, fn)
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
        head = render_decision(self.template, first.state, first.question, first.descriptions)
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

    def _score(self, prefix: list[int], suffixes: list[list[int]]) -> tuple[Any, Any, dict]:
        hit = self._restore_cached(prefix)
        logits, lse, stats = self.core.score(prefix, suffixes, self.letter_ids, self.branch_mode)
        if not hit and self.cache.worth_caching(prefix) and stats["prefix_reused"] == 0:
            self.cache.put(prefix, self.core.get_prefix_state(), self.core.get_prefix_logits())
        stats["prefix_cache_hit"] = hit
        return logits, lse, stats

    # -- exactness -------------------------------------------------------------------------------

    def check_exactness(self) -> ExactnessCheck:
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
        """Score questions that share one state: one prefill, the questions as branches."""
        if self.unavailable_reason:
            raise Unavailable(self.unavailable_reason)
        start = time.perf_counter()
        self._check_special_tokens(questions)
        self._check_budget(questions)
        rendered = [
            render_decision(self.template, q.state, q.question, q.descriptions) for q in questions
        ]
        fulls = [self.tokenize_prompt(r.text) for r in rendered]
        self._check_limits(questions, fulls)
        state_tokens = self.tokenize_prompt(rendered[0].state_prefix)
        prefix, boundary = self.split(state_tokens, fulls)
        proven = len(prefix) > 0 and all(
            r.state_prefix == rendered[0].state_prefix for r in rendered
        )
        rows: list[tuple[np.ndarray, float]] = []
        if proven:
            suffixes = [f[len(prefix) :] for f in fulls]
            evaluated = len(prefix) + sum(len(s) for s in suffixes)
            self._check_request_tokens(evaluated)
            logits, lse, stats = self._score(prefix, suffixes)
            rows = [(logits[i], float(lse[i])) for i in range(len(questions))]
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
            evaluated = sum(len(f) for f in fulls)
            self._check_request_tokens(evaluated)
            prefill = 0.0
            for f in fulls:
                logits, lse, stats = self.core.score(f, [[]], self.letter_ids)
                rows.append((logits[0], float(lse[0])))
                prefill += stats["prefill_seconds"]
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
        for q, r, f, (row, lse_value) in zip(questions, rendered, fulls, rows):
            option_logits = np.asarray(row[: len(q.descriptions)], dtype=np.float64)
            scored.append(
                Scored(
                    question=q,
                    option_logits=option_logits,
                    probabilities=readout.softmax(option_logits, q.temperature),
                    allowed_token_mass=readout.allowed_token_mass(option_logits, lse_value),
                    input_tokens=len(f),
                    prompt=r.text,
                )
            )
        timing["forward_seconds"] = timing["prefill_seconds"] + timing["suffix_seconds"]
        timing["total_seconds"] = time.perf_counter() - start
        return Evaluation(scored=scored, timing=timing, evaluated_tokens=evaluated)

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

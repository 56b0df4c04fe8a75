"""The decision service: turns validated decisions into engine calls and engine numbers into
results. Runs every engine call on one worker thread so the event loop never blocks."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from semif_proxy import native, readout, rotations
from semif_proxy.errors import (
    Cancelled,
    EngineFailure,
    InvalidRequest,
    PayloadTooLarge,
    Unavailable,
)
from semif_proxy.model_files import model_sha256
from semif_proxy.prefix_cache import PrefixCache
from semif_proxy.prompt import (
    LETTERS,
    PROMPT_VERSION,
    ChatTemplate,
    check_letters,
    render_decision,
)
from semif_proxy.schemas import Decision
from semif_proxy.settings import Settings

log = logging.getLogger("semif_proxy.engine")
READOUT = "letter-logits"
T = TypeVar("T")


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


@dataclass(frozen=True)
class Rotated:
    """One question asked in k option orders (orders[0] is the request's own)."""

    orders: list[list[int]]
    questions: list[Question]

    @classmethod
    def of(cls, base: Question, k: int) -> Rotated:
        orders = rotations.rotations(len(base.descriptions), k)
        asked = [replace(base, descriptions=tuple(base.descriptions[i] for i in o)) for o in orders]
        return cls(orders, asked)


@dataclass
class Evaluation:
    scored: list[Scored]
    timing: dict[str, Any] = field(default_factory=dict)
    evaluated_tokens: int = 0


def walk_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a JSON value (keys too) with its field path; a stack, not recursion."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                stack.append((v, f"{where}.{k}"))
                stack.append((str(k), where))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))


def shared_prefix(state_tokens: Sequence[int], fulls: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix that the state's own tokens and every full prompt agree on, and
    that leaves each prompt at least one token to decode. This is the proof that one prefill
    serves every question: it *is* the start of each prompt, token for token."""
    limit = min([len(state_tokens)] + [len(f) - 1 for f in fulls])
    k = 0
    while k < limit and all(f[k] == state_tokens[k] for f in fulls):
        k += 1
    return list(state_tokens[:k])


class DecisionEngine:
    # BPE vocabularies often merge the state's closing quote with the comma that follows
    # ('",'); the split then moves back a token or two. Any further and the split is refused.
    boundary_slack = 4

    def __init__(self, core: native.Engine, settings: Settings, sha256: str) -> None:
        self.core = core
        self.settings = settings
        self.sha256 = sha256
        self.cache = PrefixCache(settings.prefix_cache_mb * 1024 * 1024)
        # On the CPU every question is decoded right after the prefix, one at a time, and the
        # prefix state is put back in between ("restore"): its cells then lie exactly where a
        # one-piece evaluation puts them, whatever the model's attention kernels chunk by.
        # Branches batched side by side ("copy") sit after each other's masked cells; on
        # Qwen2.5-0.5B that moved probabilities by up to 0.014 against single requests (bench
        # `order`), and on a CPU it buys no speed (singles on a held prefix were as fast as a
        # batch). On a GPU batching pays and its kernels are not bit-exact anyway.
        offloaded = settings.n_gpu_layers != 0 and bool(native.gpu_devices())  # -1: all layers
        self.branch_mode = "copy" if offloaded else "restore"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semif-engine")
        self._job_lock = threading.Lock()
        self._current_job: object | None = None
        self._abort_requested_at: float | None = None
        self.aborted_jobs = 0
        self._specials = self._special_pattern()
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
        self.unavailable_reason = (
            None
            if check.ok
            else "decisions are disabled for this model: " + "; ".join(check.problems[:5])
        )
        if self.unavailable_reason:
            log.error(
                "letter check failed",
                extra={"event": "letter_check", "problems": list(check.problems)},
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

    def _special_pattern(self) -> re.Pattern[str] | None:
        texts = set()
        for token in self.core.special_tokens():
            text = self.core.token_piece(token).decode("utf-8", "replace")
            if text.strip():
                texts.add(text)
        if not texts:
            return None
        return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))

    def check_injection(self, value: Any, path: str) -> None:
        if self._specials is None:
            return
        for where, text in walk_strings(value, path):
            found = self._specials.search(text)
            if found:
                raise InvalidRequest(
                    f"{where}: contains {found.group(0)!r}, a special token of the model; "
                    "template tokens are not allowed in requests",
                    field=where,
                )

    # -- evaluation (engine thread) ------------------------------------------------------------

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

    def _check_budget(self, questions: Sequence[Question]) -> None:
        """Refuse a request that cannot fit before any prompt is built: the state's own tokens
        (counted once) against the prompt limit, and the state plus every question's own text
        against the request's token budget. Rendering and tokenizing every prompt of a large
        request (questions x rotations, each holding the state) is real work; it only starts
        once the request is known to fit."""
        first = questions[0]
        head = render_decision(self.template, first.state, first.question, first.descriptions)
        limit = self.settings.prompt_token_limit
        # No token is longer than the vocabulary's longest piece: a state with more bytes than
        # limit x that cannot fit, and is refused before the tokenizer reads all of it.
        size = len(head.state_prefix.encode("utf-8"))
        state_tokens = -(-size // self.max_token_bytes)
        if state_tokens < limit:
            state_tokens = len(self.core.tokenize(head.state_prefix, True, True))
        if state_tokens >= limit:
            raise PayloadTooLarge(
                f"{first.path}.state: the state alone is {state_tokens} tokens, over the prompt "
                f"limit of {limit}",
                field=f"{first.path}.state",
                tokens=state_tokens,
                limit=limit,
            )
        counts: dict[str, int] = {}

        def tokens(text: str) -> int:
            # A text costs at least its own tokens, less one for a merge at either edge.
            if text not in counts:
                counts[text] = max(0, len(self.core.tokenize(text, False, False)) - 1)
            return counts[text]

        lower = state_tokens + sum(
            tokens(q.question) + sum(tokens(d) for d in q.descriptions) for q in questions
        )
        self._check_request_tokens(lower, at_least=True)

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

    def evaluate(self, questions: Sequence[Question]) -> Evaluation:
        """Score questions that share one state: one prefill, the questions as branches."""
        if self.unavailable_reason:
            raise Unavailable(self.unavailable_reason)
        start = time.perf_counter()
        checked: set[int] = set()  # rotations share their state and texts: check each once
        for q in questions:
            for value, where in (
                (q.id, f"{q.path}.id"),
                (q.state, f"{q.path}.state"),
                (q.question, f"{q.path}.question"),
                *((d, f"{q.path}.options[{i}].description") for i, d in enumerate(q.descriptions)),
            ):
                if id(value) not in checked:
                    checked.add(id(value))
                    self.check_injection(value, where)
        self._check_budget(questions)
        rendered = [
            render_decision(self.template, q.state, q.question, q.descriptions) for q in questions
        ]
        fulls = [self.tokenize_prompt(r.text) for r in rendered]
        self._check_limits(questions, fulls)
        state_tokens = self.tokenize_prompt(rendered[0].state_prefix)
        proof = shared_prefix(state_tokens, fulls)
        boundary = len(state_tokens) - len(proof)
        # The split lands on an aligned cell, so the first branch sits exactly where its tokens
        # sit when the whole prompt is evaluated at once (and every other branch on an aligned
        # cell too, see engine.cpp): a decision then gets the bits of a one-piece evaluation,
        # which is what llama-server computes. Splitting mid-chunk moved letter log-probs by
        # up to 0.3 (measured on SmolLM2 over every split point of one prompt).
        prefix = proof[: len(proof) - len(proof) % self.core.cell_align]
        proven = (
            all(r.state_prefix == rendered[0].state_prefix for r in rendered)
            and len(prefix) > 0
            and boundary <= self.boundary_slack
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
                "prefix_alignment_tokens": len(proof) - len(prefix),
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

    # -- the decision API shape ------------------------------------------------------------------

    prompt_version = PROMPT_VERSION

    @staticmethod
    def prompt_sha256(prompt: str) -> str:
        return hashlib.sha256(prompt.encode("utf-8")).hexdigest()

    def rotated(self, decisions: Sequence[Decision], paths: Sequence[str]) -> list[Rotated]:
        """Each decision in the option orders it is asked in: its own order first, then the
        rotations it asks for (or SEMIF_PERMUTATIONS)."""
        temperature = self.settings.temperature.for_type("decision")
        return [
            Rotated.of(
                Question(
                    path=path,
                    id=d.id,
                    state=d.state,
                    question=d.question,
                    descriptions=tuple(o.description for o in d.options),
                    temperature=temperature,
                    return_prompt=d.return_prompt,
                ),
                d.permutations or self.settings.permutations,
            )
            for d, path in zip(decisions, paths)
        ]

    def result_body(
        self, decision: Decision, orders: list[list[int]], runs: Sequence[Scored], timing: dict
    ) -> dict[str, Any]:
        first = runs[0]
        body: dict[str, Any] = {
            "id": decision.id,
            "option_ids": [o.id for o in decision.options],
            "probabilities": [float(p) for p in first.probabilities],
            "option_logits": [float(v) for v in first.option_logits],
            "input_tokens": first.input_tokens,
            "allowed_token_mass": first.allowed_token_mass,
            "prompt_sha256": self.prompt_sha256(first.prompt),
            "prompt_version": PROMPT_VERSION,
            "readout": READOUT,
            "model": self.model_info,
            "timing": {
                "forward_seconds": timing["forward_seconds"],
                "total_seconds": timing["total_seconds"],
            },
        }
        if len(runs) > 1:
            body.update(self.rotation_fields(orders, runs))
        if decision.return_prompt:
            body["prompt"] = first.prompt
        return body

    @staticmethod
    def rotation_fields(orders: list[list[int]], runs: Sequence[Scored]) -> dict[str, Any]:
        """The mean over rotations, in the request's option order. `prompt` and `prompt_sha256`
        stay those of the request's own order; the logits of every rotation are reported."""
        probs, moved = rotations.combine([(o, r.probabilities) for o, r in zip(orders, runs)])
        logits = [rotations.back_to_request_order(o, r.option_logits) for o, r in zip(orders, runs)]
        return {
            "probabilities": [float(p) for p in probs],
            "option_logits": [float(v) for v in np.mean(logits, axis=0)],
            "input_tokens": sum(r.input_tokens for r in runs),
            "allowed_token_mass": float(np.mean([r.allowed_token_mass for r in runs])),
            "readout": f"{READOUT}, mean of {len(runs)} rotations",
            "rotations": {
                "orders": orders,
                "option_logits": [[float(v) for v in row] for row in logits],
                "argmax_moved": moved,
            },
        }

    def evaluate_checked(self, questions: Sequence[Question]) -> Evaluation:
        """evaluate(), with llama.cpp failures turned into API errors."""
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

    def evaluate_rotated(self, asked: Sequence[Rotated]) -> tuple[list[list[Scored]], Evaluation]:
        """All orders of all questions on the one prefix; the runs handed back per question."""
        evaluation = self.evaluate_checked([q for r in asked for q in r.questions])
        runs, start = [], 0
        for r in asked:
            runs.append(evaluation.scored[start : start + len(r.questions)])
            start += len(r.questions)
        return runs, evaluation

    def decide(
        self, decisions: Sequence[Decision], paths: Sequence[str]
    ) -> tuple[list[dict], dict]:
        asked = self.rotated(decisions, paths)
        runs, evaluation = self.evaluate_rotated(asked)
        bodies = [
            self.result_body(d, r.orders, scored, evaluation.timing)
            for d, r, scored in zip(decisions, asked, runs)
        ]
        return bodies, evaluation.timing


__all__ = ["LETTERS", "DecisionEngine", "Evaluation", "Question", "Rotated", "Scored"]

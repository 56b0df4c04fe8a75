"""The decision engine worker: plain questions in, scored option rows and timing out.

It holds the native engine (`semif_proxy._engine`) and runs every call on it on one engine
thread (its own, or one shared by the engines of a process: thread.py), the prompt tokens
(rendered by prompt.py, tokenized exactly as llama-server tokenizes them), the checks that run
before any forward pass (checks.py), the proven and aligned prefix split (prefix_split.py), the
prefix cache, group scoring (scoring.py) and the exactness self-check at load (exactness.py). It
knows nothing of HTTP or of the APIs' request schemas: the services (api/) turn requests into
`Question`s and rows into answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from semif_proxy.cpu.plan import memory_room
from semif_proxy.engine import exactness, label_tree, native
from semif_proxy.engine.bias import BiasCorrection, ContentFreeCache
from semif_proxy.engine.checks import TokenChecks
from semif_proxy.engine.deliberate import DeliberateScoring
from semif_proxy.engine.exactness import ExactnessCheck
from semif_proxy.engine.injection import SpecialTokenPolicy
from semif_proxy.engine.jobs import EngineJobs
from semif_proxy.engine.layout import Layout
from semif_proxy.engine.layout import resolve as resolve_layout
from semif_proxy.engine.prefix_cache import PrefixCache
from semif_proxy.engine.prompt import (
    NUMBER_LABELS,
    ChatTemplate,
    check_letters,
    check_numbers,
    decision_messages,
    render_decision,
)
from semif_proxy.engine.questions import (
    NO_MODEL_TIMING,
    Evaluation,
    Question,
    Scored,
    merge_timings,
)
from semif_proxy.engine.readouts import ReadoutScoring
from semif_proxy.engine.scoring import GroupScoring
from semif_proxy.engine.thread import EngineThread
from semif_proxy.errors import Cancelled, EngineFailure, PayloadTooLarge, Unavailable
from semif_proxy.model.files import model_sha256
from semif_proxy.settings import Settings, repack_choice
from semif_proxy.settings.defaults import CONTENT_FREE_CACHE_ENTRIES

log = logging.getLogger("semif_proxy.engine")


class DecisionEngine(
    EngineJobs, TokenChecks, GroupScoring, ReadoutScoring, DeliberateScoring, BiasCorrection
):
    """Questions in, scored rows out: the load and its checks here; job control (jobs.py), the
    checks before a forward pass (checks.py), group scoring (scoring.py; continuation and
    direct readouts: readouts.py; deliberate: deliberate.py) and content-free answers (bias.py)
    are its parts."""

    def __init__(
        self,
        core: native.Engine,
        settings: Settings,
        sha256: str,
        thread: EngineThread | None = None,
        layout: Layout | None = None,
    ) -> None:
        self.core = core
        # Every forward pass on one thread (thread.py), this constructor's own check too.
        # A thread passed in is shared with other engines of the process and outlives this one.
        self._owns_thread = thread is None
        self.thread = thread or EngineThread()
        self.settings = settings
        self.sha256 = sha256
        self.cache = PrefixCache(settings.prefix_cache_mb * 1024 * 1024)
        self.content_free = ContentFreeCache(CONTENT_FREE_CACHE_ENTRIES)
        self._word_ids: dict[str, tuple[int, ...]] = {}
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
        # Weight repacking as the core was loaded with it (SEMIF_REPACK; llama-server likewise)
        # and why: in the "decision engine ready" line and /health.
        layout = layout or Layout(repack_choice(settings.repack))
        self.model_info["repack"] = {"setting": settings.repack, **layout.as_dict()}

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        settings: Settings,
        threads: int | None = None,
        thread: EngineThread | None = None,
        layout: Layout | None = None,
    ) -> DecisionEngine:
        """Load on `thread` (a new one when None, owned by the engine), where the engine will
        run: model load, self-check and every decision on one thread. `layout`: the weights'
        layout as the server chose it for every process (None: chosen here, for this engine
        alone; SEMIF_REPACK=auto measures, engine/layout.py)."""
        n_threads = threads or settings.thread_plan.engine
        if layout is None:
            # As a default server on this machine would choose it (chat on, the engine and two
            # llama-servers): a command's answers and rows (decide, eval, calibrate) are then
            # computed in the layout that serves them, which reads the same kept measurement.
            layout = asyncio.run(resolve_layout(settings, n_threads, 3, memory_room(), chat=True))
        if settings.backend_dir is not None:
            native.load_backends(settings.backend_dir)
        owned = thread is None
        on = thread or EngineThread()
        repack = layout.choice

        def build() -> DecisionEngine:
            core = native.Engine(
                str(settings.model_path),
                n_ctx=settings.n_ctx,
                n_threads=n_threads,
                n_gpu_layers=settings.n_gpu_layers,
                n_seq=settings.n_parallel,
                n_batch=settings.n_batch,
                n_ubatch=settings.engine_ubatch,
                repack=repack.on,
            )
            # Hashed once the file has loaded: a file that is no model is not read in full.
            engine = cls(core, settings, model_sha256(settings.model_path), on, layout)
            engine._owns_thread = owned
            return engine

        try:
            return on.call(build)
        except BaseException:
            if owned:
                on.shutdown()
            raise

    @classmethod
    async def start(
        cls, settings: Settings, threads: int | None = None, layout: Layout | None = None
    ) -> DecisionEngine:
        return await asyncio.get_running_loop().run_in_executor(
            None, cls.load, settings, threads, None, layout
        )

    def close(self) -> None:
        if self._owns_thread:
            self.thread.shutdown()

    # -- exactness and evaluation (engine thread) ------------------------------------------------

    def check_exactness(self) -> ExactnessCheck:
        return self.thread.call(lambda: exactness.check(self))

    def evaluate(self, questions: Sequence[Question]) -> Evaluation:
        """Score questions that share one state: one prefill per prompt head (letters and
        numbers have their own system text), the questions as branches. A question with one
        option is answered without the model. On the engine thread, whoever calls."""
        return self.thread.call(lambda: self._evaluate_corrected(questions))

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
            groups: dict[tuple[str, str], list[int]] = {}
            for i in asked:
                # One readout per prompt head (their system texts differ anyway).
                head = (questions[i].readout, rendered[i].state_prefix)
                groups.setdefault(head, []).append(i)
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
                for (_, head), members in groups.items()
            ]
            # The whole request against its budget before any group's work starts.
            evaluated = sum(plan.evaluated for plan in plans)
            self._check_request_tokens(evaluated)
            for members, plan in zip(groups.values(), plans):
                group_scored, group_timing = self._evaluate_group(plan)
                for i, row in zip(members, group_scored):
                    scored[i] = row
                timings.append(group_timing)
            # A group that knows what it evaluated says so (deliberate: what it generated, not
            # its whole budget); the others evaluate what they planned.
            evaluated = sum(t.pop("evaluated_tokens", p.evaluated) for t, p in zip(timings, plans))
            timing = merge_timings(timings)
        for i, q in enumerate(questions):
            if scored[i] is None:
                scored[i] = self._single_option(q)
        timing["forward_seconds"] = timing["prefill_seconds"] + timing["suffix_seconds"]
        timing["total_seconds"] = time.perf_counter() - start
        return Evaluation(
            scored=[s for s in scored if s is not None], timing=timing, evaluated_tokens=evaluated
        )

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

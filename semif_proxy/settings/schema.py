"""The Settings object: every setting as a typed field with its default, validated once."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from semif_proxy import redact
from semif_proxy.calibration.abstention import Thresholds
from semif_proxy.calibration.position_prior import PositionPrior
from semif_proxy.calibration.setting import Temperature
from semif_proxy.cpu.plan import ThreadPlan, plan_threads
from semif_proxy.engine.prompt import MAX_OPTIONS
from semif_proxy.model.gguf import read_gguf
from semif_proxy.settings.defaults import (
    AUTO_CTX_MAX,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELIBERATION_TOKENS,
    FALLBACK_CTX,
    MIN_CTX,
    UBATCH_CPU,
    UBATCH_GPU,
)
from semif_proxy.settings.readouts import BiasCorrections, Normalizations, Readouts

# The words read as on and off (SEMIF_CHAT=off, SM_LLAMA_CPP_REPACK=true, ...).
TRUE_WORDS = frozenset({"1", "true", "on", "yes"})
FALSE_WORDS = frozenset({"0", "false", "off", "no"})


class SettingsError(ValueError):
    """A configuration problem; the message names the variable."""


def context_for(model_path: Path) -> int:
    """The engine's context for a model when none is set: its training context (GGUF
    `<arch>.context_length`), at most AUTO_CTX_MAX. A file whose header cannot be read gets
    FALLBACK_CTX (the engine's own load then says what is wrong with it)."""
    try:
        trained = read_gguf(model_path).arch_value("context_length")
    except (OSError, ValueError, KeyError, struct.error):
        return FALLBACK_CTX
    if not isinstance(trained, int) or trained < MIN_CTX:
        return FALLBACK_CTX
    return min(trained, AUTO_CTX_MAX)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: Path
    # Loopback unless told otherwise: `semif-proxy serve` on a VM is not reachable from other
    # hosts by default. The image's entrypoint defaults SEMIF_HOST to 0.0.0.0 (SageMaker and
    # `docker run -p` connect from outside the container).
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    upstream_port: int = Field(8081, ge=1, le=65535)
    # The second llama-server's port (CPU sharing "dynamic"); None: no port for it (set by
    # load_settings), the gate instead.
    second_upstream_port: int | None = Field(None, ge=1, le=65535)
    chat: bool = True
    decisions: bool = True
    llama_server_args: tuple[str, ...] = ()
    llama_server_binary: Path | None = None
    # llama-server supervision: start-up may take minutes for a large GGUF (SageMaker allows up
    # to 600 s), a probe every health_interval, a restart after max_failed_probes in a row.
    llama_server_start_timeout: float = Field(600.0, gt=0.0)
    health_interval: float = Field(2.0, gt=0.0, le=3600.0)
    health_timeout: float = Field(2.0, gt=0.0, le=3600.0)
    max_failed_probes: int = Field(5, ge=1, le=1000)

    # Decision engine
    # The engine's context in tokens; 0 (the default): the model's training context, at most
    # AUTO_CTX_MAX (context_for below), so that the largest request the limits accept (255
    # options with one-line descriptions) fits. Shared with llama-server when set through
    # SM_LLAMA_CPP_CTX_SIZE.
    n_ctx: int = Field(0, ge=0, le=1 << 20)
    n_threads: int = Field(0, ge=0, le=1024)  # 0: as cpu_sharing says (semif_proxy/cpu/plan.py)
    # How the engine and llama-server share the CPU (cpu/policy.py): gate (both get every
    # core, one job at a time), dynamic (every core to whichever runs alone, divided while
    # both run: a second llama-server with half the threads takes chat then), split (cores
    # divided, both at once), none; auto: dynamic on the CPU (the gate where it cannot
    # divide), none with GPU.
    cpu_sharing: Literal["auto", "gate", "dynamic", "split", "none"] = "auto"
    n_gpu_layers: int = Field(0, ge=-1)
    # Sequences: the prefix, at least one branch and the alignment filler need three.
    n_parallel: int = Field(8, ge=3, le=64)
    n_batch: int = Field(2048, ge=32, le=1 << 16)
    # Tokens per llama_decode call; 0: UBATCH_CPU on the CPU, UBATCH_GPU with layers offloaded.
    n_ubatch: int = Field(0, ge=0, le=1 << 16)
    # Where ggml's loadable backends are (GGML_BACKEND_DL builds); None: libllama's folder.
    backend_dir: Path | None = None
    # Weight repacking (llama.cpp's --repack), for the engine and every llama-server together.
    # on: each process keeps a private copy of the weights in the CPU backend's interleaved
    # layouts; off: all of them read the one mmap'ed file. auto: both layouts timed at start-up
    # in throw-away children (a crash rules one out), repacked only where measurably faster
    # and the copies fit, the measurement kept per build, model, CPU and threads
    # (docs/operations.md, "The weights' layout"); with GPU layers, settings/repack.py's rule.
    repack: Literal["auto", "on", "off"] = "auto"
    temperature: Temperature = Temperature()
    # Fitted position priors (`semif-proxy calibrate --rows`), read with the temperatures.
    position_prior: PositionPrior = PositionPrior()
    # Where every answered question's per-order option logits go (JSON lines); None: nowhere.
    rows_log: Path | None = None

    # Limits
    # SageMaker's own payload limit for a real-time invocation (6 MB) and Batch Transform's
    # default MaxPayloadInMB: any call the platform delivers fits.
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024)
    max_decisions: int = Field(32, ge=1, le=1024)
    # System One: questions per request (and per state of a batch), states per batch.
    max_questions: int = Field(64, ge=1, le=1024)
    # Options per decision or System One question (Jev's own limit is 255, the most here).
    max_options: int = Field(MAX_OPTIONS, ge=1, le=MAX_OPTIONS)
    max_batch_states: int = Field(64, ge=1, le=1024)
    # Lines of one JSON Lines call (Batch Transform packs lines by bytes, up to MaxPayloadInMB).
    max_batch_lines: int = Field(1000, ge=1, le=1_000_000)
    max_prompt_tokens: int = Field(0, ge=0)  # per decision; 0: the engine context
    max_request_tokens: int = Field(0, ge=0)  # per request; 0: 4 x the context
    max_in_flight: int = Field(4, ge=1, le=4096)
    max_queue: int = Field(64, ge=0, le=100_000)
    # SageMaker cuts a real-time invocation at 60 s: our own deadline ends the work first, so
    # the caller gets a 504 that says why instead of the platform's bare error.
    request_timeout: float = Field(55.0, gt=0.0)
    prefix_cache_mb: int = Field(256, ge=0)
    permutations: int = Field(1, ge=1, le=MAX_OPTIONS)
    # The readout of a question that names none, per question type (settings/readouts.py).
    readout: Readouts = Readouts()
    # A continuation's normalisation where the question names none, per type
    # (settings/readouts.py): `mean` (per token), `sum`, or `pmi` (divided by the option's
    # probability after a content-free state).
    normalization: Normalizations = Normalizations()
    # The bias correction of a question that names none, per type (settings/readouts.py).
    bias_correction: BiasCorrections = BiasCorrections()
    # The most tokens a `deliberate` question may let the model write before its answer is read
    # (its `deliberation_tokens`; one that sends none gets 64, DEFAULT_DELIBERATION_TOKENS, or
    # this when lower). Each is a forward pass; they count against the prompt limit.
    max_deliberation_tokens: int = Field(DEFAULT_MAX_DELIBERATION_TOKENS, ge=1, le=1 << 16)
    # Option labels: letters up to 26 options and numbers beyond ("auto"), or numbers always.
    labels: Literal["auto", "numbers"] = "auto"
    # System One abstention: a number, or a map by question type and option-count bucket
    # (semif_proxy/abstention.py); a request's own min_confidence wins. None: no threshold.
    min_confidence: Thresholds | None = None

    api_key: str | None = Field(None, repr=False)
    # POST /invocations without the key (SageMaker authenticates it at its edge and sends no
    # key of ours). Only where SageMaker fronts the container: the image's entrypoint called
    # with `serve` defaults it to on; anywhere else /invocations needs the key like any route.
    invocations_public: bool = False
    strict: bool = False
    playground: bool = True
    # llama-server's admin routes (/slots, POST /props, /lora-adapters) through the proxy.
    upstream_admin: bool = False
    log_level: str = "INFO"
    shutdown_grace: float = Field(20.0, ge=0.0)

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return upper

    @field_validator("n_ctx")
    @classmethod
    def _context_floor(cls, value: int) -> int:
        if 0 < value < MIN_CTX:
            raise ValueError(f"Input should be 0 (from the model) or at least {MIN_CTX}")
        return value

    @model_validator(mode="after")
    def _context_from_model(self) -> Settings:
        if self.n_ctx == 0:
            # Frozen, and validated once: the resolved size is what every reader sees.
            object.__setattr__(self, "n_ctx", context_for(self.model_path))
        return self

    @field_validator("repack", mode="before")
    @classmethod
    def _repack_words(cls, value: Any) -> Any:
        # SM_LLAMA_CPP_REPACK=true/false, as llama-server's own switch reads.
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str):
            lowered = value.strip().lower()
            return "on" if lowered in TRUE_WORDS else "off" if lowered in FALSE_WORDS else lowered
        return value

    @field_validator("rows_log")
    @classmethod
    def _rows_log_folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.parent.is_dir():
            raise ValueError(f"the folder {str(value.parent)!r} does not exist")
        return value

    @property
    def thread_plan(self) -> ThreadPlan:
        return plan_threads(
            self.cpu_sharing,
            self.n_threads,
            self.n_gpu_layers,
            self.chat,
            self.decisions,
            self.llama_server_args,
            second_server=self.second_upstream_port is not None,
        )

    @property
    def engine_ubatch(self) -> int:
        """The engine's tokens per llama_decode call. On the CPU, under `dynamic` sharing, a chat
        preempts the call in progress and its work so far is lost: 256 bounds that loss while a
        prompt of up to 256 tokens still goes in one call, as llama-server's would (shorter
        calls cost a few per cent at ~200 tokens here: docs/operations.md, "CPU sharing"). The
        GPU wants big ones, and shares no cores."""
        wanted = self.n_ubatch or (UBATCH_GPU if self.n_gpu_layers else UBATCH_CPU)
        return min(wanted, self.n_batch)

    @property
    def prompt_token_limit(self) -> int:
        return self.max_prompt_tokens or self.n_ctx

    @property
    def request_token_limit(self) -> int:
        return self.max_request_tokens or 4 * self.n_ctx

    def public_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["api_key"] = "***" if self.api_key else None
        data["llama_server_args"] = redact.redact_argv(self.llama_server_args)
        return data

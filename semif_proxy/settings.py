"""All configuration, parsed and validated once at start-up into one frozen object.

Every setting's default lives here, in the Settings fields and the constants beside them; the
native engine gets each of its values from here (its own C++ defaults serve direct callers such
as tests). A bad value stops start-up with a message that names the environment variable.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from semif_proxy import redact
from semif_proxy.calibration.abstention import Thresholds
from semif_proxy.calibration.abstention import from_setting as min_confidence_from_setting
from semif_proxy.calibration.position_prior import PositionPrior
from semif_proxy.calibration.setting import Temperature, parse_calibration
from semif_proxy.cpu.plan import ThreadPlan, plan_threads
from semif_proxy.engine.prompt import MAX_OPTIONS, labels_for
from semif_proxy.llama_server import ports
from semif_proxy.llama_server.args import PREFIX, LlamaArgsError, llama_server_args
from semif_proxy.model.files import ModelNotFoundError, discover_model
from semif_proxy.model.gguf import read_gguf

DEFAULT_MAX_BODY_BYTES = 6 << 20
# The engine's default tokens per llama_decode call (SEMIF_UBATCH_SIZE), by device.
UBATCH_CPU = 256
UBATCH_GPU = 512
# The engine's context when SEMIF_CTX_SIZE is unset: the model's training context, at most
# this. 8,192 tokens hold a 255-option System One choice with one-line descriptions (about
# 4,000 prompt tokens, its label tree and the alignment cells of its branches; tested), at a KV
# cache of 8,192 x the model's bytes per token (SmolLM2-135M: 189 MB; Qwen2.5-1.5B: 235 MB).
AUTO_CTX_MAX = 8192
# A model whose header does not say its training context gets this.
FALLBACK_CTX = 4096
MIN_CTX = 64
# Defaults no variable sets, kept with the rest:
# - failed probes in a row before llama-server counts as unhealthy (one missed probe is not a
#   stall: on a busy 2-core machine a /health call can miss its timeout while it generates);
LLAMA_UNHEALTHY_AFTER = 2
# - the restart backoff of an exited llama-server, first and longest (seconds);
LLAMA_BACKOFF_INITIAL_S = 0.5
LLAMA_BACKOFF_MAX_S = 30.0
# - CPU sharing dynamic: how long chats wait for the second llama-server's chats to end before
#   they join them (cpu/dynamic.py);
CPU_DRAIN_GRACE_S = 5.0
# - JSON Lines lines per engine job: a job holds the engine (and the CPU) until it ends, so a
#   large group of one state is cut into jobs that other requests can run between.
JSON_LINES_PER_JOB = 16


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
    # layouts; off: all of them read the one mmap'ed file. auto: off on an x86 CPU without AMX
    # (faster there, bench/results/repack-*.json), on with AMX (repack_choice below).
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
            return "on" if lowered in _TRUE else "off" if lowered in _FALSE else lowered
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


# Settings field -> (environment variable, fallback SM_LLAMA_CPP_* variables)
_ENV: dict[str, tuple[str, tuple[str, ...]]] = {
    "host": ("SEMIF_HOST", ()),
    # SageMaker inference pipelines name the port in SAGEMAKER_BIND_TO_PORT: it wins.
    "port": ("SAGEMAKER_BIND_TO_PORT", ("SM_LLAMA_CPP_PORT", "SEMIF_PORT")),
    "upstream_port": ("LLAMA_CPP_UPSTREAM_PORT", ()),
    "chat": ("SEMIF_CHAT", ()),
    "decisions": ("SEMIF_DECISIONS", ()),
    "llama_server_binary": ("SEMIF_LLAMA_SERVER", ()),
    "llama_server_start_timeout": ("SEMIF_LLAMA_SERVER_START_TIMEOUT", ()),
    "health_interval": ("SEMIF_HEALTH_INTERVAL", ()),
    "health_timeout": ("SEMIF_HEALTH_TIMEOUT", ()),
    "max_failed_probes": ("SEMIF_MAX_FAILED_PROBES", ()),
    "n_ctx": ("SEMIF_CTX_SIZE", ("SM_LLAMA_CPP_CTX_SIZE", "SM_LLAMA_CPP_C")),
    "n_threads": ("SEMIF_THREADS", ("SM_LLAMA_CPP_THREADS", "SM_LLAMA_CPP_T")),
    "cpu_sharing": ("SEMIF_CPU_SHARING", ()),
    "n_gpu_layers": (
        "SEMIF_N_GPU_LAYERS",
        ("SM_LLAMA_CPP_N_GPU_LAYERS", "SM_LLAMA_CPP_GPU_LAYERS", "SM_LLAMA_CPP_NGL"),
    ),
    "n_parallel": ("SEMIF_PARALLEL", ()),
    "n_batch": ("SEMIF_BATCH_SIZE", ()),
    "n_ubatch": ("SEMIF_UBATCH_SIZE", ()),
    "backend_dir": ("SEMIF_GGML_BACKEND_DIR", ()),
    # SM_LLAMA_CPP_REPACK is read here, not forwarded: the engine and llama-server obey it alike.
    "repack": ("SEMIF_REPACK", ("SM_LLAMA_CPP_REPACK",)),
    # The calibration (temperatures and position priors); SEMIF_TEMPERATURE is its old name.
    "temperature": ("SEMIF_CALIBRATION", ("SEMIF_TEMPERATURE",)),
    "rows_log": ("SEMIF_ROWS_LOG", ()),
    "max_body_bytes": ("SEMIF_MAX_BODY_BYTES", ()),
    "max_decisions": ("SEMIF_MAX_DECISIONS", ()),
    "max_questions": ("SEMIF_MAX_QUESTIONS", ()),
    "max_batch_states": ("SEMIF_MAX_BATCH_STATES", ()),
    "max_batch_lines": ("SEMIF_MAX_BATCH_LINES", ()),
    "max_prompt_tokens": ("SEMIF_MAX_PROMPT_TOKENS", ()),
    "max_request_tokens": ("SEMIF_MAX_REQUEST_TOKENS", ()),
    "max_in_flight": ("SEMIF_MAX_IN_FLIGHT", ()),
    "max_queue": ("SEMIF_MAX_QUEUE", ()),
    "request_timeout": ("SEMIF_REQUEST_TIMEOUT", ()),
    "prefix_cache_mb": ("SEMIF_PREFIX_CACHE_MB", ()),
    "permutations": ("SEMIF_PERMUTATIONS", ()),
    "labels": ("SEMIF_LABELS", ()),
    "max_options": ("SEMIF_MAX_OPTIONS", ()),
    "min_confidence": ("SEMIF_MIN_CONFIDENCE", ()),
    # SM_LLAMA_CPP_API_KEY is the proxy's key too; it is never forwarded (llama_args.py).
    "api_key": ("SEMIF_API_KEY", ("SM_LLAMA_CPP_API_KEY",)),
    "invocations_public": ("SEMIF_INVOCATIONS_PUBLIC", ()),
    "strict": ("SEMIF_STRICT", ()),
    "playground": ("SEMIF_PLAYGROUND", ()),
    "upstream_admin": ("SEMIF_UPSTREAM_ADMIN", ()),
    "log_level": ("SEMIF_LOG_LEVEL", ()),
    "shutdown_grace": ("SEMIF_SHUTDOWN_GRACE", ()),
}
_BOOLS = {"chat", "decisions", "strict", "playground", "upstream_admin", "invocations_public"}
_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


class RepackChoice(NamedTuple):
    on: bool
    why: str


# /proc/cpuinfo flags under which llama.cpp's repacked weights are the fast path: its AMX
# kernels only run on the repacked ("extra") buffers. Without them, on a 2-core AVX-512 EPYC,
# the unrepacked layout prefilled Qwen2.5-1.5B Q4_K_M 1.25x faster and 0.5B as fast
# (bench/results/repack-*.json), and every process then shares one copy of the weights
# (memory-*.json: the default server's three processes 3,484 -> 1,701 MiB PSS on 1.5B).
AMX_FLAGS = frozenset({"amx_int8", "amx_tile"})


def repack_choice(setting: str, cpuinfo: str | None = None) -> RepackChoice:
    """SEMIF_REPACK resolved for this machine (cpuinfo: /proc/cpuinfo's text, read when None).
    auto: on with AMX; off on another x86 CPU; llama.cpp's default (on) where /proc/cpuinfo
    shows no x86 flags (ARM's NEON/i8mm repacked kernels were not measured here)."""
    if setting in ("on", "off"):
        return RepackChoice(setting == "on", f"{setting}: as set (SEMIF_REPACK)")
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "flags":
            flags.update(rest.split())
    amx = sorted(flags & AMX_FLAGS)
    if amx:
        return RepackChoice(
            True,
            f"on: the CPU has AMX ({', '.join(amx)}): llama.cpp's repacked kernels are "
            "its fast path",
        )
    if not flags:
        return RepackChoice(
            True, "on: no x86 CPU flags in /proc/cpuinfo: llama.cpp's default (not measured here)"
        )
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "x86"
    return RepackChoice(
        False,
        f"off: {simd} without AMX: the unrepacked layout prefilled Qwen2.5-1.5B Q4_K_M 1.25x "
        "faster on a 2-core AVX-512 EPYC (bench/results/repack-*.json), and every process "
        "shares one copy of the weights",
    )


def _parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected on/off (or true/false, 1/0), got {value!r}")


def _raw_values(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field, (name, fallbacks) in _ENV.items():
        for var in (name, *fallbacks):
            if var in env and env[var].strip() != "":
                sources[field] = var
                raw = env[var]
                try:
                    if field in _BOOLS:
                        values[field] = _parse_bool(raw)
                    elif field == "temperature":
                        values[field], values["position_prior"] = parse_calibration(raw)
                        sources["position_prior"] = var
                    elif field == "min_confidence":
                        values[field] = min_confidence_from_setting(raw)
                    else:
                        values[field] = raw
                except (ValueError, ValidationError) as exc:
                    raise SettingsError(f"{var}: {exc}") from None
                break
    return values, sources


def _resolve_model(env: Mapping[str, str], model: str | None) -> Path:
    if model:
        path = Path(model)
        source = "--model"
    elif env.get("SM_LLAMA_CPP_MODEL"):
        path = Path(env["SM_LLAMA_CPP_MODEL"])
        if not path.is_absolute():
            path = Path(env.get("SM_LLAMA_CPP_MODEL_DIR") or "/opt/ml/model") / path
        source = "SM_LLAMA_CPP_MODEL"
    else:
        model_dir = Path(env.get("SM_LLAMA_CPP_MODEL_DIR") or "/opt/ml/model")
        try:
            return discover_model(model_dir)
        except ModelNotFoundError as exc:
            raise SettingsError(f"SM_LLAMA_CPP_MODEL_DIR: {exc}") from None
    if not path.is_file():
        raise SettingsError(f"{source}: model file {path} does not exist")
    return path


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings from the environment; keyword overrides (CLI flags) win over variables."""
    env = dict(os.environ if env is None else env)
    values, sources = _raw_values(env)
    public = overrides.get("port") or values.get("port", Settings.model_fields["port"].default)
    try:
        allowed = ports.safe_port_range(env)
        if "upstream_port" not in values and allowed is not None:
            values["upstream_port"] = ports.safe_upstream_port(allowed, public)
            sources["upstream_port"] = "SAGEMAKER_SAFE_PORT_RANGE"
    except ports.PortError as exc:
        raise SettingsError(str(exc)) from None
    model = overrides.pop("model", None)
    values["model_path"] = _resolve_model(env, model)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        var = sources.get(field, _ENV.get(field, (field,))[0])
        raise SettingsError(f"{var}: {first['msg']} (got {first.get('input')!r})") from None
    second = ports.second_port(settings.upstream_port, settings.port, allowed)
    settings = settings.model_copy(update={"second_upstream_port": second})
    _check_prior_prompts(settings, sources.get("position_prior", "SEMIF_CALIBRATION"))
    return _complete(env, settings)


def _check_prior_prompts(settings: Settings, var: str) -> None:
    """A position prior measured on one prompt version (letters, say) is refused where this
    server asks that option count with another (numbers, after SEMIF_LABELS changed): the model
    favours positions differently under each, and dividing the wrong prior out would skew every
    answer rather than fix it."""
    for n, fitted in sorted(settings.position_prior.prompt_versions.items()):
        asked = labels_for(n, settings.labels).prompt_version
        if asked != fitted:
            raise SettingsError(
                f"{var}: the position prior for {n} options was fitted on {fitted} prompts, "
                f"but with SEMIF_LABELS={settings.labels} they are asked as {asked}; refit it "
                "(semif-proxy calibrate --rows) on rows asked this way, or set SEMIF_LABELS back"
            )


def _complete(env: Mapping[str, str], settings: Settings) -> Settings:
    """What needs the validated settings: llama-server's argv, checked against the flags of the
    binary that will run (only with chat on: a decision-only server needs no binary), and the
    secret values the logs must never show."""
    redact.register(redact.secret_values(env, settings.api_key, PREFIX))
    if not settings.chat:
        return settings
    try:
        args = llama_server_args(env, settings.llama_server_binary)
    except LlamaArgsError as exc:
        raise SettingsError(str(exc)) from None
    return settings.model_copy(update={"llama_server_args": tuple(args)})


__all__ = ["PREFIX", "Settings", "SettingsError", "Temperature", "load_settings"]

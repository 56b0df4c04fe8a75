"""Settings from the environment: which variable sets which field (SM_LLAMA_CPP_* fallbacks
included), the model file, SageMaker's port range, and what needs the validated settings
(llama-server's argv checked against its binary, the secrets the logs must never show)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from semif_proxy import redact
from semif_proxy.calibration.abstention import from_setting as min_confidence_from_setting
from semif_proxy.calibration.setting import parse_calibration
from semif_proxy.engine.prompt import labels_for
from semif_proxy.llama_server import ports
from semif_proxy.llama_server.args import PREFIX, LlamaArgsError, llama_server_args
from semif_proxy.model.files import ModelNotFoundError, discover_model
from semif_proxy.settings.readouts import (
    parse_bias_corrections,
    parse_normalizations,
    parse_readouts,
)
from semif_proxy.settings.schema import FALSE_WORDS, TRUE_WORDS, Settings, SettingsError

# Settings field -> (environment variable, fallback SM_LLAMA_CPP_* variables)
ENV_VARS: dict[str, tuple[str, tuple[str, ...]]] = {
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
    "readout": ("SEMIF_READOUT", ()),
    "normalization": ("SEMIF_NORMALIZATION", ()),
    "bias_correction": ("SEMIF_BIAS_CORRECTION", ()),
    "max_deliberation_tokens": ("SEMIF_MAX_DELIBERATION_TOKENS", ()),
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
BOOL_FIELDS = {"chat", "decisions", "strict", "playground", "upstream_admin", "invocations_public"}


def _parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError(f"expected on/off (or true/false, 1/0), got {value!r}")


def _raw_values(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field, (name, fallbacks) in ENV_VARS.items():
        for var in (name, *fallbacks):
            if var in env and env[var].strip() != "":
                sources[field] = var
                raw = env[var]
                try:
                    if field in BOOL_FIELDS:
                        values[field] = _parse_bool(raw)
                    elif field == "temperature":
                        values[field], values["position_prior"] = parse_calibration(raw)
                        sources["position_prior"] = var
                    elif field == "readout":
                        values[field] = parse_readouts(raw)
                    elif field == "normalization":
                        values[field] = parse_normalizations(raw)
                    elif field == "bias_correction":
                        values[field] = parse_bias_corrections(raw)
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
        var = sources.get(field, ENV_VARS.get(field, (field,))[0])
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

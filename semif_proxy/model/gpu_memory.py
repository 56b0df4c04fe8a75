"""Will the decision engine and llama-server both fit on the GPU? Checked once at start-up.

The engine (in this process) and llama-server (a child) each load the model and each hold their
own KV cache: with full offload the card holds the weights twice. Without this check the second
one to allocate dies half-way through start-up with a CUDA out-of-memory error, or llama-server's
automatic fitting (`--fit`, on by default) quietly shrinks its context to what the engine left.

The estimate, per process that uses the GPU:
- weights: the GGUF file's size x the offloaded share of its layers (n_gpu_layers out of
  n_layer + 1, the output layer being the +1; llama.cpp's own count). An upper bound: the token
  embeddings stay in host memory;
- KV cache: n_ctx x offloaded layers x KV heads x (key + value head dims) x bytes per element
  (2: F16, llama.cpp's default cache type);
- compute buffers: one micro-batch (512 tokens: llama-server's default, the engine's
  Settings.engine_ubatch with offload) of logits (n_vocab floats each) and hidden
  states, and, with flash attention off (the engine always; llama-server unless told), the
  attention score matrix: n_ubatch x n_ctx x n_head floats;
- a fixed allowance for the CUDA context, cuBLAS and ggml's memory pool.
Their sum, plus a safety margin (1 GiB, what llama.cpp's own --fit leaves free), must not exceed
the free memory of the GPUs (`native.devices()`); else start-up stops with a message that names
the settings to change. A process with no layer offloaded is not counted (its CUDA context, a
few hundred MB, is what the margin is for).

    python -m semif_proxy.model.gpu_memory --model M.gguf \
        [--engine-layers 999 --server-ctx 8192 ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from semif_proxy.model.gpu_estimate import (
    KV_TYPE_BYTES,
    MARGIN,
    N_UBATCH,
    GiB,
    ModelShape,
    Need,
    Process,
    Verdict,
    check,
    gpu_devices,
    need,
)
from semif_proxy.settings import Settings, SettingsError

log = logging.getLogger("semif_proxy.gpu_memory")


class GpuMemoryError(SettingsError):
    """The processes that use the GPU would not fit in its free memory."""


# -- settings -> processes ---------------------------------------------------------------------

_CTX = ("--ctx-size", "-c")
_NGL = ("--n-gpu-layers", "--gpu-layers", "-ngl")
_FA = ("--flash-attn", "-fa")
_UB = ("--ubatch-size", "-ub")
_CTK = ("--cache-type-k", "-ctk")
_CTV = ("--cache-type-v", "-ctv")


def _arg(args: Sequence[str], names: Sequence[str]) -> str | None:
    value = None
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            value = args[i + 1]
        elif "=" in a and a.split("=", 1)[0] in names:
            value = a.split("=", 1)[1]
    return value


def server_process(args: Sequence[str], shape: ModelShape) -> Process:
    """llama-server as its argv configures it, its own defaults where a flag is absent:
    context 0 (the model's training context), every layer (auto), flash attention as the
    proxy sets it (off unless told)."""
    notes = []
    ctx_text = _arg(args, _CTX)
    n_ctx = int(ctx_text) if ctx_text else 0
    if n_ctx <= 0:
        n_ctx = shape.n_ctx_train
        notes.append(f"context unset: the model's {n_ctx}")
    ngl_text = _arg(args, _NGL)
    if ngl_text is None or ngl_text.strip().lower() in ("auto", "all", "-1"):
        ngl = -1
    else:
        ngl = int(ngl_text)
    fa = (_arg(args, _FA) or "off").strip().lower() in ("on", "1", "true", "enabled", "auto")
    ub = int(_arg(args, _UB) or N_UBATCH)
    kv_k = KV_TYPE_BYTES.get((_arg(args, _CTK) or "f16").lower(), 2.0)
    kv_v = KV_TYPE_BYTES.get((_arg(args, _CTV) or "f16").lower(), 2.0)
    return Process(
        "llama-server",
        ngl,
        n_ctx,
        flash_attn=fa,
        n_ubatch=ub,
        kv_bytes=(kv_k + kv_v) / 2,
        layers_setting=f"SM_LLAMA_CPP_N_GPU_LAYERS={ngl_text if ngl_text else 'unset'}",
        ctx_setting=f"SM_LLAMA_CPP_CTX_SIZE={ctx_text if ctx_text else 'unset'}",
        note="; ".join(notes),
    )


def engine_process(settings: Settings) -> Process:
    return Process(
        "the decision engine",
        settings.n_gpu_layers,
        settings.n_ctx,
        flash_attn=False,  # always off in the engine (csrc/engine.cpp, README "The method")
        n_ubatch=settings.engine_ubatch,
        layers_setting=f"SEMIF_N_GPU_LAYERS={settings.n_gpu_layers}",
        ctx_setting=f"SEMIF_CTX_SIZE={settings.n_ctx}",
    )


def processes_for(settings: Settings, shape: ModelShape) -> list[Process]:
    out = []
    if settings.decisions:
        out.append(engine_process(settings))
    if settings.chat:
        out.append(server_process(settings.llama_server_args, shape))
    return out


def check_settings(
    settings: Settings,
    devices: Sequence[Mapping[str, Any]] | None = None,
    margin: int = MARGIN,
) -> Settings:
    """The start-up check: returns the settings unchanged when everything fits (or no GPU is
    there), raises GpuMemoryError (a SettingsError) with the advice otherwise."""
    if devices is None:
        try:
            from semif_proxy.engine import native  # the compiled extension
        except ImportError:
            return settings  # the engine's own load reports a missing extension, by name
        devices = native.devices()
    if not gpu_devices(devices):
        return settings
    shape = ModelShape.from_file(settings.model_path)
    verdict = check(shape, processes_for(settings, shape), devices, margin)
    if not verdict.fits:
        raise GpuMemoryError(verdict.message())
    if verdict.needs:
        log.info(
            "gpu memory estimate",
            extra={"event": "gpu_memory", "model": shape.name, **verdict.as_dict()},
        )
    return settings


def startup_check(settings: Settings, devices: Sequence[Mapping[str, Any]] | None = None) -> None:
    """`semif-proxy serve`'s call, once, after logging is configured: logs the estimate; when
    the processes would not fit, logs the error and stops the process with exit code 2 and the
    advice on stderr (as a configuration error), before anything is loaded."""
    try:
        check_settings(settings, devices)
    except GpuMemoryError as exc:
        log.error("gpu memory", extra={"event": "startup_failed", "error": str(exc)})
        sys.stderr.write(f"semif-proxy: configuration error: {exc}\n")
        raise SystemExit(2) from None


# -- command line ------------------------------------------------------------------------------


def choices(shape: ModelShape, ctx: int = 8192) -> list[tuple[str, list[Process]]]:
    """The configurations the README compares for one model."""
    eng = Process("the decision engine", -1, 4096, layers_setting="SEMIF_N_GPU_LAYERS=999")
    srv = Process("llama-server", -1, ctx, layers_setting="SM_LLAMA_CPP_N_GPU_LAYERS=999")
    half = (shape.n_layer + 1) // 2
    return [
        (
            "both, full offload, llama-server at the model's context",
            [eng, replace(srv, n_ctx=shape.n_ctx_train)],
        ),
        (f"both, full offload, llama-server ctx {ctx}", [eng, srv]),
        (
            f"both, llama-server ctx {ctx} with {half} layers offloaded",
            [eng, replace(srv, n_gpu_layers=half)],
        ),
        ("decisions only (SEMIF_CHAT=off)", [eng]),
        (f"chat only (SEMIF_DECISIONS=off), ctx {ctx}", [srv]),
        ("both, ctx 2048 each", [replace(eng, n_ctx=2048), replace(srv, n_ctx=2048)]),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semif_proxy.model.gpu_memory", description=__doc__
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a GGUF file (only its header is read)")
    source.add_argument("--shape-json", help="a ModelShape as JSON, for a model not at hand")
    parser.add_argument("--engine-layers", type=int, default=-1, help="0: engine on the CPU")
    parser.add_argument("--engine-ctx", type=int, default=4096)
    parser.add_argument("--server-layers", type=int, default=-1, help="0: llama-server on CPU")
    parser.add_argument("--server-ctx", type=int, default=0, help="0: the model's own")
    parser.add_argument("--free-gib", type=float, help="default: what the GPUs report")
    parser.add_argument("--choices", action="store_true", help="the README's comparison")
    args = parser.parse_args(argv)
    shape = (
        ModelShape(**json.loads(args.shape_json))
        if args.shape_json
        else ModelShape.from_file(args.model)
    )
    if args.free_gib is not None:
        free = int(args.free_gib * GiB)
        devices: list[dict[str, Any]] = [
            {"type": "gpu", "name": "given", "memory_free": free, "memory_total": free}
        ]
    else:
        from semif_proxy.engine import native

        devices = native.devices()
    out: dict[str, Any] = {"model": asdict(shape)}
    if args.choices:
        out["choices"] = {
            label: check(shape, procs, devices).as_dict() for label, procs in choices(shape)
        }
    else:
        server = ["--ctx-size", str(args.server_ctx), "--n-gpu-layers", str(args.server_layers)]
        procs = [
            Process("the decision engine", args.engine_layers, args.engine_ctx),
            server_process(server, shape),
        ]
        verdict = check(shape, procs, devices)
        out["verdict"] = verdict.as_dict()
        out["message"] = verdict.message()
    print(json.dumps(out, indent=2))
    return 0


# The estimate's names are part of this module's face: callers and tests use them from here.
__all__ = [
    "GpuMemoryError",
    "ModelShape",
    "Need",
    "Process",
    "Verdict",
    "check",
    "check_settings",
    "need",
    "processes_for",
    "server_process",
    "startup_check",
]


if __name__ == "__main__":
    raise SystemExit(main())

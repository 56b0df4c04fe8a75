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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from semif_proxy.model.gguf import GGUFInfo, SkippedArray, read_gguf
from semif_proxy.settings import Settings, SettingsError

log = logging.getLogger("semif_proxy.gpu_memory")

MiB = 1 << 20
GiB = 1 << 30
MARGIN = 1 * GiB  # llama.cpp's --fit-target default: what it leaves free on each device
CUDA_OVERHEAD = 512 * MiB  # CUDA context, cuBLAS handles and workspace, ggml's pool slack
N_UBATCH = 512  # llama-server's default micro-batch (the engine's: Settings.engine_ubatch)
# Bytes per element of llama.cpp's KV cache types (quantized types: block bytes / 32 values).
KV_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


class GpuMemoryError(SettingsError):
    """The processes that use the GPU would not fit in its free memory."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model (read from its GGUF header)."""

    name: str
    file_bytes: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> ModelShape:
        def number(key: str, default: int | None = None) -> int:
            value = info.arch_value(key, default)
            if isinstance(value, list):  # per-layer values (some architectures): the largest
                value = max(value)
            if value is None:
                raise ValueError(f"{info.path}: no {info.architecture}.{key} in the GGUF header")
            return int(value)

        n_embd = number("embedding_length")
        n_head = number("attention.head_count")
        tokens = info.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, SkippedArray):
            n_vocab = tokens.count
        elif isinstance(tokens, list):
            n_vocab = len(tokens)
        else:
            n_vocab = number("vocab_size", 0)
        head_dim = n_embd // max(1, n_head)
        return cls(
            name=str(info.metadata.get("general.name", info.path.name)),
            file_bytes=info.file_bytes,
            n_layer=number("block_count"),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=number("attention.head_count_kv", n_head),
            head_dim_k=number("attention.key_length", head_dim),
            head_dim_v=number("attention.value_length", head_dim),
            n_vocab=n_vocab,
            n_ctx_train=number("context_length", 4096),
        )

    @classmethod
    def from_file(cls, path: Path | str) -> ModelShape:
        return cls.from_gguf(read_gguf(path))


@dataclass(frozen=True)
class Process:
    """One process that loads the model, as configured. n_gpu_layers < 0: all layers."""

    name: str
    n_gpu_layers: int
    n_ctx: int
    flash_attn: bool = False
    n_ubatch: int = N_UBATCH
    kv_bytes: float = 2.0
    layers_setting: str = ""
    ctx_setting: str = ""
    note: str = ""  # how a default was read ("unset: the model's 40960")


@dataclass(frozen=True)
class Need:
    process: Process
    layers_on_gpu: int
    layers_total: int  # n_layer + 1
    weights: int
    kv: int
    compute: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    def as_dict(self) -> dict[str, Any]:
        return {
            "process": self.process.name,
            "n_ctx": self.process.n_ctx,
            "layers_on_gpu": self.layers_on_gpu,
            "weights_bytes": self.weights,
            "kv_bytes": self.kv,
            "compute_bytes": self.compute,
            "overhead_bytes": self.overhead,
            "total_bytes": self.total,
        }


def need(shape: ModelShape, proc: Process) -> Need:
    """What one process holds on the GPU (see the module docstring for each part)."""
    all_layers = shape.n_layer + 1
    on_gpu = all_layers if proc.n_gpu_layers < 0 else min(proc.n_gpu_layers, all_layers)
    kv_layers = max(0, on_gpu - 1)  # llama.cpp offloads the output layer first
    weights = shape.file_bytes * on_gpu // all_layers
    kv = int(
        proc.n_ctx
        * kv_layers
        * shape.n_head_kv
        * (shape.head_dim_k + shape.head_dim_v)
        * proc.kv_bytes
    )
    n_ubatch = min(proc.n_ubatch, proc.n_ctx)
    floats = n_ubatch * (shape.n_vocab + 8 * shape.n_embd)
    if not proc.flash_attn:
        padded_ctx = -(-proc.n_ctx // 256) * 256
        floats += n_ubatch * padded_ctx * shape.n_head
    compute = 4 * floats if on_gpu else 0
    return Need(proc, on_gpu, all_layers, weights, kv, compute, CUDA_OVERHEAD)


def gpu_devices(devices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [d for d in devices if d.get("type") in ("gpu", "igpu")]


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def describe(n: Need) -> str:
    p = n.process
    layers = f"{n.layers_on_gpu}/{n.layers_total} layers"
    settings = ", ".join(s for s in (p.layers_setting, p.ctx_setting) if s)
    note = f"; {p.note}" if p.note else ""
    return (
        f"{p.name} ({layers}, n_ctx {p.n_ctx}; {settings}{note}) needs ~{gib(n.total)}: "
        f"weights {gib(n.weights)}, KV cache {gib(n.kv)}, compute {gib(n.compute)}, "
        f"CUDA {gib(n.overhead)}"
    )


@dataclass(frozen=True)
class Verdict:
    fits: bool
    needs: tuple[Need, ...]
    free: int
    total: int
    margin: int
    devices: tuple[str, ...]

    @property
    def required(self) -> int:
        return sum(n.total for n in self.needs) + self.margin

    def message(self) -> str:
        lines = [describe(n) for n in self.needs]
        where = " + ".join(self.devices) or "no GPU"
        head = (
            f"GPU memory: {' and '.join(n.process.name for n in self.needs)} need "
            f"~{gib(self.required - self.margin)} together, plus a {gib(self.margin)} margin, "
            f"but {where} has {gib(self.free)} free of {gib(self.total)}."
        )
        if self.fits:
            return head.replace("but", "and", 1)
        advice = (
            "Each process holds its own copy of the offloaded weights and its own KV cache. "
            "To fit: serve one of the two (SEMIF_DECISIONS=off: chat only; SEMIF_CHAT=off: "
            "decisions only), offload fewer layers (SM_LLAMA_CPP_N_GPU_LAYERS for llama-server, "
            "SEMIF_N_GPU_LAYERS for the engine), or use smaller contexts (SM_LLAMA_CPP_CTX_SIZE "
            "for llama-server, SEMIF_CTX_SIZE for the engine). Unset, llama-server takes the "
            "model's training context and every layer."
        )
        return "\n".join([head, *(f"- {line}" for line in lines), advice])

    def as_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "required_bytes": self.required,
            "free_bytes": self.free,
            "total_bytes": self.total,
            "margin_bytes": self.margin,
            "devices": list(self.devices),
            "needs": [n.as_dict() for n in self.needs],
        }


def check(
    shape: ModelShape,
    processes: Sequence[Process],
    devices: Sequence[Mapping[str, Any]],
    margin: int = MARGIN,
) -> Verdict:
    """Compare what the processes need with the GPUs' free memory (summed: llama.cpp splits
    layers across several GPUs). Processes with no layer offloaded are left out."""
    gpus = gpu_devices(devices)
    needs = tuple(need(shape, p) for p in processes if p.n_gpu_layers != 0)
    free = sum(int(d.get("memory_free", 0)) for d in gpus)
    total = sum(int(d.get("memory_total", 0)) for d in gpus)
    names = tuple(str(d.get("description") or d.get("name", "?")) for d in gpus)
    required = sum(n.total for n in needs) + margin
    fits = not needs or not gpus or required <= free
    return Verdict(fits, needs, free, total, margin, names)


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


if __name__ == "__main__":
    raise SystemExit(main())

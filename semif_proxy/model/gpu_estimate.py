"""The GPU memory estimate of one process that holds a model (gpu_memory.py says what it counts
and why), and the verdict for all of them against the GPUs' free memory. Pure: no settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semif_proxy.model.gguf import GGUFInfo, SkippedArray, read_gguf

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

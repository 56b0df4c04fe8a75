"""A small GGUF writer and a random-weight llama model made with it.

The image's selfcheck loads such a model to prove that the engine really computes on the
libllama and backends it runs against (a model load is where a GGML_BACKEND_DL build without its
backends fails); the tests and the GPU check write bigger ones the same way. Only what a llama
model needs is written: scalars, strings, arrays of them, F32/F16 tensors (GGUF version 3).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

ALIGNMENT = 32
_U32, _I32, _F32, _BOOL, _STRING, _ARRAY, _U64 = 4, 5, 6, 7, 8, 9, 10
_TENSOR_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _string(out: BinaryIO, text: str) -> None:
    data = text.encode("utf-8")
    out.write(struct.pack("<Q", len(data)))
    out.write(data)


def _value_type(value: Any) -> int:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _U32 if value >= 0 else _I32
    if isinstance(value, float):
        return _F32
    if isinstance(value, str):
        return _STRING
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def _scalar(out: BinaryIO, kind: int, value: Any) -> None:
    if kind == _STRING:
        _string(out, value)
    else:
        out.write(struct.pack({_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?"}[kind], value))


def _kv(out: BinaryIO, key: str, value: Any) -> None:
    _string(out, key)
    if isinstance(value, (list, tuple)):
        kind = _value_type(value[0]) if value else _I32
        if kind == _U32:
            kind = _I32  # integer arrays (token types) are INT32 in llama.cpp's files
        out.write(struct.pack("<IIQ", _ARRAY, kind, len(value)))
        for item in value:
            _scalar(out, kind, item)
    else:
        kind = _value_type(value)
        out.write(struct.pack("<I", kind))
        _scalar(out, kind, value)


def _pad(out: BinaryIO) -> None:
    out.write(b"\0" * (-out.tell() % ALIGNMENT))


def write_gguf(path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Path:
    """A GGUF file with these key/values and tensors (numpy shape order; GGUF stores it
    reversed)."""
    arrays = {name: np.ascontiguousarray(t) for name, t in tensors.items()}
    with Path(path).open("wb") as out:
        out.write(b"GGUF")
        out.write(struct.pack("<IQQ", 3, len(arrays), len(metadata) + 1))
        _kv(out, "general.alignment", ALIGNMENT)
        for key, value in metadata.items():
            _kv(out, key, value)
        offset = 0
        for name, t in arrays.items():
            if t.dtype not in _TENSOR_TYPES:
                raise TypeError(f"{name}: only float32 and float16 tensors, got {t.dtype}")
            _string(out, name)
            out.write(struct.pack("<I", t.ndim))
            for dim in reversed(t.shape):
                out.write(struct.pack("<Q", dim))
            out.write(struct.pack("<IQ", _TENSOR_TYPES[t.dtype], offset))
            offset += t.nbytes + (-t.nbytes % ALIGNMENT)
        _pad(out)
        for t in arrays.values():
            out.write(t.tobytes())
            _pad(out)
    return Path(path)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-character table, which llama.cpp's BPE expects."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tiny_llama(
    path: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int | None = None,
    n_ctx: int = 4096,
    extra_tokens: Sequence[str] = (),
    merges: Sequence[str] = (),
    chat_template: str | None = CHATML_TEMPLATE,
    dtype: type = np.float32,
    name: str = "semif-tiny",
) -> Path:
    """A random-weight llama model with a byte-level BPE vocabulary (all 256 bytes, so any text
    tokenizes; `extra_tokens` with their `merges`), ChatML special tokens and template."""
    rng = np.random.default_rng(seed)
    table = byte_to_unicode()
    tokens = [table[b] for b in range(256)] + list(extra_tokens) + list(SPECIALS)
    types = [TOKEN_NORMAL] * (len(tokens) - len(SPECIALS)) + [TOKEN_CONTROL] * len(SPECIALS)
    n_vocab = len(tokens)
    n_ff = n_ff or 2 * n_embd
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": name,
        "general.file_type": 0 if np.dtype(dtype) == np.float32 else 1,
        "llama.context_length": n_ctx,
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layer,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head,
        "llama.rope.dimension_count": n_embd // n_head,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": list(merges) or [f"{table[ord('a')]} {table[ord('b')]}"],
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
    }
    if chat_template is not None:
        metadata["tokenizer.chat_template"] = chat_template

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(dtype)

    ones = np.ones(n_embd, dtype=np.float32)  # norms stay F32, as llama.cpp's converters do
    tensors = {
        "token_embd.weight": weight(n_vocab, n_embd),
        "output_norm.weight": ones,
        "output.weight": weight(n_vocab, n_embd),
    }
    for i in range(n_layer):
        tensors[f"blk.{i}.attn_norm.weight"] = ones
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"blk.{i}.{part}.weight"] = weight(n_embd, n_embd)
        tensors[f"blk.{i}.ffn_norm.weight"] = ones
        tensors[f"blk.{i}.ffn_gate.weight"] = weight(n_ff, n_embd)
        tensors[f"blk.{i}.ffn_up.weight"] = weight(n_ff, n_embd)
        tensors[f"blk.{i}.ffn_down.weight"] = weight(n_embd, n_ff)
    return write_gguf(path, metadata, tensors)

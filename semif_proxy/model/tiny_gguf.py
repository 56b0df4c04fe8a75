"""A random-weight llama model, written with the GGUF writer (gguf_writer.py).

The image's selfcheck loads such a model to prove that the engine really computes on the
libllama and backends it runs against (a model load is where a GGML_BACKEND_DL build without its
backends fails); the tests and the GPU check write bigger ones the same way. Only what a llama
model needs is written: scalars, strings, arrays of them, F32/F16 tensors (GGUF version 3).

A model of a few hundred million parameters (the GPU check's stand-in for a real one, which is
too big to travel) is written in seconds with ``fast=True``: every weight is a slice of one
pool of random numbers, streamed to the file tensor by tensor, never all in memory:

    python -m semif_proxy.model.tiny_gguf --params 300M --out /tmp/m300.gguf
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from semif_proxy.model.gguf_writer import TOKEN_CONTROL, TOKEN_NORMAL, LazyTensor, write_gguf
from semif_proxy.model.tiny_vocab import WORDS, byte_to_unicode, pair_tokens, word_merges

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


POOL_SIZE = (1 << 24) - 3


class _WeightPool:
    def __init__(self, rng: np.random.Generator, dtype: type) -> None:
        self._rng = rng
        self._dtype = np.dtype(dtype)
        self._unit = rng.standard_normal(POOL_SIZE, dtype=np.float32)
        self._scaled: dict[float, np.ndarray] = {}

    def tensor(self, scale: float, *shape: int) -> LazyTensor:
        pool = self._scaled.get(scale)
        if pool is None:
            pool = self._scaled[scale] = (self._unit * np.float32(scale)).astype(self._dtype)
        count = int(np.prod(shape, dtype=np.int64))
        start = int(self._rng.integers(POOL_SIZE))

        def chunks() -> Iterable[np.ndarray]:
            left, at = count, start
            while left:
                piece = pool[at : at + left]
                yield piece
                left -= len(piece)
                at = 0

        return LazyTensor(tuple(shape), self._dtype, chunks)


def write_tiny_llama(
    path: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int | None = None,
    n_ctx: int = 4096,
    n_vocab: int | None = None,
    extra_tokens: Sequence[str] = (),
    merges: Sequence[str] = (),
    words: Sequence[str] = (),
    chat_template: str | None = CHATML_TEMPLATE,
    dtype: type = np.float32,
    name: str = "semif-tiny",
    fast: bool = False,
) -> Path:
    """A random-weight llama model with a byte-level BPE vocabulary (all 256 bytes, so any text
    tokenizes; `extra_tokens` with their `merges`), ChatML special tokens and template.

    `words` become single tokens through merges (`word_merges`; WORDS: English at a real
    model's characters per token). `n_vocab` pads the vocabulary with two-byte filler tokens up
    to that size (the output matrix then has a real model's width). `n_head_kv` < `n_head`
    makes grouped-query attention.
    `fast` takes every weight from one random pool and scales it by 1/sqrt(fan-in) (token
    embeddings 1, output 2/sqrt(n_embd): letter logits spread by about 2), so activations stay
    well inside F16's range at any depth; without it weights are independent N(0, 0.5^2), as
    the small models always had them.
    """
    rng = np.random.default_rng(seed)
    table = byte_to_unicode()
    n_head_kv = n_head_kv or n_head
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    tokens = [table[b] for b in range(256)] + list(extra_tokens)
    merges = list(merges)
    if words:
        word_tokens, more_merges = word_merges(words)
        known = set(tokens)
        tokens += [t for t in word_tokens if t not in known]
        merges += more_merges
    if n_vocab is not None:
        missing = n_vocab - len(tokens) - len(SPECIALS)
        if missing < 0:
            raise ValueError(f"n_vocab={n_vocab} is below the {len(tokens) + 3} tokens needed")
        tokens += pair_tokens(missing, tokens)
    tokens += list(SPECIALS)
    types = [TOKEN_NORMAL] * (len(tokens) - len(SPECIALS)) + [TOKEN_CONTROL] * len(SPECIALS)
    n_vocab = len(tokens)
    n_ff = n_ff or 2 * n_embd
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": name,
        "general.file_type": 0 if np.dtype(dtype) == np.float32 else 1,
        "llama.context_length": n_ctx,
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layer,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
        "llama.rope.dimension_count": head_dim,
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

    pool = _WeightPool(rng, dtype) if fast else None

    def weight(*shape: int, scale: float | None = None) -> np.ndarray | LazyTensor:
        if pool is not None:
            return pool.tensor(scale if scale is not None else shape[-1] ** -0.5, *shape)
        return (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(dtype)

    ones = np.ones(n_embd, dtype=np.float32)  # norms stay F32, as llama.cpp's converters do
    tensors: dict[str, np.ndarray | LazyTensor] = {
        "token_embd.weight": weight(n_vocab, n_embd, scale=1.0),
        "output_norm.weight": ones,
        "output.weight": weight(n_vocab, n_embd, scale=2.0 * n_embd**-0.5),
    }
    for i in range(n_layer):
        tensors[f"blk.{i}.attn_norm.weight"] = ones
        tensors[f"blk.{i}.attn_q.weight"] = weight(n_embd, n_embd)
        tensors[f"blk.{i}.attn_k.weight"] = weight(n_embd_kv, n_embd)
        tensors[f"blk.{i}.attn_v.weight"] = weight(n_embd_kv, n_embd)
        tensors[f"blk.{i}.attn_output.weight"] = weight(n_embd, n_embd)
        tensors[f"blk.{i}.ffn_norm.weight"] = ones
        tensors[f"blk.{i}.ffn_gate.weight"] = weight(n_ff, n_embd)
        tensors[f"blk.{i}.ffn_up.weight"] = weight(n_ff, n_embd)
        tensors[f"blk.{i}.ffn_down.weight"] = weight(n_embd, n_ff)
    return write_gguf(path, metadata, tensors)


def llama_params(
    *, n_embd: int, n_layer: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int
) -> int:
    """Parameters of the model `write_tiny_llama` writes with these sizes (norms included)."""
    n_embd_kv = n_embd // n_head * n_head_kv
    layer = 2 * n_embd * n_embd + 2 * n_embd_kv * n_embd + 3 * n_embd * n_ff + 2 * n_embd
    return 2 * n_vocab * n_embd + n_embd + n_layer * layer


def plan_for_params(
    params: int,
    *,
    n_embd: int = 1024,
    n_head: int = 16,
    n_head_kv: int = 16,
    n_ff: int | None = None,
    n_vocab: int = 32000,
) -> dict[str, int]:
    """The layer count (at least 1) that brings a model of these widths closest to `params`."""
    n_ff = n_ff or 2 * n_embd
    sizes = {"n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv, "n_ff": n_ff}
    sizes["n_vocab"] = n_vocab
    one = llama_params(n_layer=1, **sizes)
    per_layer = llama_params(n_layer=2, **sizes) - one
    n_layer = max(1, round((params - (one - per_layer)) / per_layer))
    return {**sizes, "n_layer": n_layer}


def parse_count(text: str) -> int:
    """'300M', '1.5B', '20k' or a plain number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBgG]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a count like 300M or 1.5B, got {text!r}")
    factor = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}[match[2].lower()]
    return round(float(match[1]) * factor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semif_proxy.model.tiny_gguf",
        description="Write a random-weight llama GGUF (F16, byte-level BPE, ChatML) of about "
        "--params parameters; prints what was written as JSON.",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=parse_count, default=parse_count("300M"))
    parser.add_argument("--n-embd", type=int, default=1024)
    parser.add_argument("--n-layer", type=int, help="default: what --params asks for")
    parser.add_argument("--n-head", type=int, default=16)
    parser.add_argument("--n-head-kv", type=int, help="default: --n-head")
    parser.add_argument("--n-ff", type=int, help="default: 2 x --n-embd")
    parser.add_argument("--n-vocab", type=int, default=32000)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bytes-only", action="store_true", help="no word merges: one byte a token"
    )
    args = parser.parse_args(argv)
    plan = plan_for_params(
        args.params,
        n_embd=args.n_embd,
        n_head=args.n_head,
        n_head_kv=args.n_head_kv or args.n_head,
        n_ff=args.n_ff,
        n_vocab=args.n_vocab,
    )
    if args.n_layer:
        plan["n_layer"] = args.n_layer
    started = time.perf_counter()
    dtype = np.float16 if args.dtype == "f16" else np.float32
    name = f"semif-random-{llama_params(**plan) / 1e6:.0f}M"
    write_tiny_llama(
        args.out,
        seed=args.seed,
        n_ctx=args.n_ctx,
        dtype=dtype,
        name=name,
        fast=True,
        words=() if args.bytes_only else WORDS,
        **plan,
    )
    summary = {
        "path": str(args.out),
        "name": name,
        "params": llama_params(**plan),
        "bytes": args.out.stat().st_size,
        "seconds": round(time.perf_counter() - started, 2),
        "n_ctx": args.n_ctx,
        "dtype": args.dtype,
        **plan,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A small GGUF writer and a random-weight llama model made with it.

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
import itertools
import json
import re
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LazyTensor:
    """A tensor whose bytes are made only while the file is written (`chunks` yields them in
    order, each a contiguous array of `dtype`), so a big model never sits in memory whole."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: Callable[[], Iterable[np.ndarray]]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_gguf(
    path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, np.ndarray | LazyTensor]
) -> Path:
    """A GGUF file with these key/values and tensors (numpy shape order; GGUF stores it
    reversed)."""
    arrays = {
        name: t if isinstance(t, LazyTensor) else np.ascontiguousarray(t)
        for name, t in tensors.items()
    }
    with Path(path).open("wb") as out:
        out.write(b"GGUF")
        out.write(struct.pack("<IQQ", 3, len(arrays), len(metadata) + 1))
        _kv(out, "general.alignment", ALIGNMENT)
        for key, value in metadata.items():
            _kv(out, key, value)
        offset = 0
        for name, t in arrays.items():
            dtype = np.dtype(t.dtype)
            if dtype not in _TENSOR_TYPES:
                raise TypeError(f"{name}: only float32 and float16 tensors, got {dtype}")
            _string(out, name)
            out.write(struct.pack("<I", t.ndim))
            for dim in reversed(t.shape):
                out.write(struct.pack("<Q", dim))
            out.write(struct.pack("<IQ", _TENSOR_TYPES[dtype], offset))
            offset += t.nbytes + (-t.nbytes % ALIGNMENT)
        _pad(out)
        for name, t in arrays.items():
            if isinstance(t, LazyTensor):
                written = 0
                for chunk in t.chunks():
                    piece = np.ascontiguousarray(chunk, dtype=t.dtype)
                    out.write(memoryview(piece).cast("B"))
                    written += piece.nbytes
                if written != t.nbytes:
                    raise ValueError(f"{name}: wrote {written} bytes, expected {t.nbytes}")
            else:
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


# The fast weights: one pool of unit normals (a length that no row width divides, so rows are
# not repeats of each other), sliced from a random offset for each tensor.
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


def pair_tokens(count: int, taken: Sequence[str] = ()) -> list[str]:
    """`count` two-byte tokens (in the byte-to-unicode alphabet, so every one detokenizes):
    filler that brings a vocabulary to a real model's size. Without merges the tokenizer never
    produces them, so text still tokenizes one byte a token."""
    table = byte_to_unicode()
    seen = set(taken)
    out: list[str] = []
    for a in range(256):
        for b in range(256):
            if len(out) == count:
                return out
            token = table[a] + table[b]
            if token not in seen:
                out.append(token)
    if len(out) < count:
        raise ValueError(f"at most {len(out)} two-byte filler tokens, asked for {count}")
    return out


# Words that `words=WORDS` makes single tokens (alone and after a space), so that English text
# and the decision prompt tokenize at about a real model's rate (~4-5 characters a token)
# instead of one byte a token: the decision prompt's own words, JSON's punctuation, and
# common English (bench/gpu.py builds its evidence texts from them).
_WORD_TEXT = """
    You are a careful decision function Apply the criterion to evidence and choose one listed
    option that fits best Answer with only letter of nothing else letters options description
    state question which should handle this ticket customer email order support queue billing
    account access shipping delivery payment refund invoice password reset login problem
    problems tracking team urgent late charged twice again still never arrives cannot log in
    the a an of to in on for with from by at as is was were be been has have had it its this
    that these those there their they we you he she not no yes or but if then than so very
    more most less all any some each every other new old first last next day days week month
    time year today before after during while since until about over under into out up down
    again also only just even well good bad high low long short small large same different
    please thanks hello customer service product price cost store shop web card bank warehouse
    carrier package parcel box address city street number date hour minute call phone message
    reply sent send received receive open closed help issue request report update change cancel
    return exchange damaged missing wrong right correct item items quantity total amount due
    paid pay charge credit debit balance plan subscription renew renewal trial free premium
    error failed failure works working broken slow fast crash bug app website page button
    system user assistant three times requested invoices refunds questions answers case cases
"""
WORDS = (*_WORD_TEXT.split(), '{"', '":', '",', '"}', '"},', "}]", '."')


def word_merges(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """Tokens and BPE merges, learned the way BPE is trained (the most frequent adjacent pair
    first, until none is left), that make each word one token: alone, after a space,
    capitalised, and capitalised after a space. Applied in rank order, as llama.cpp applies
    them, they give every such word back as one token."""
    table = byte_to_unicode()
    forms = dict.fromkeys(
        f for w in words for f in (w, " " + w, w[:1].upper() + w[1:], " " + w[:1].upper() + w[1:])
    )
    encoded = ("".join(table[b] for b in form.encode("utf-8")) for form in forms)
    pieces = [list(text) for text in encoded if len(text) > 1]
    tokens: list[str] = []
    merges: list[str] = []
    known = {table[b] for b in range(256)}
    while pieces:
        counts: dict[tuple[str, str], int] = {}
        for seq in pieces:
            for pair in itertools.pairwise(seq):
                counts[pair] = counts.get(pair, 0) + 1
        left, right = max(counts, key=lambda p: (counts[p], p))
        joined = left + right
        merges.append(f"{left} {right}")
        if joined not in known:
            known.add(joined)
            tokens.append(joined)
        merged = []
        for seq in pieces:
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == left and seq[i + 1] == right:
                    out.append(joined)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            if len(out) > 1:
                merged.append(out)
        pieces = merged
    return tokens, merges


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

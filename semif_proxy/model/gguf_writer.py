"""A small GGUF writer (version 3): scalars, strings, arrays of them, F32/F16 tensors, each tensor
streamed to the file (a LazyTensor makes its data only when written). Only what a llama model
needs; tiny_gguf.py writes random-weight models with it."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

ALIGNMENT = 32
_U32, _I32, _F32, _BOOL, _STRING, _ARRAY, _U64 = 4, 5, 6, 7, 8, 9, 10
_TENSOR_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


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

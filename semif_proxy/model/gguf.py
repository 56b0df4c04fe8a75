"""What a GGUF file says about its model, read from its header in pure Python (no gguf package,
no libllama): the key/value metadata and the tensor directory. Only the header is read (a few
MB at most, even for a 150k-token vocabulary), never the weights.

The format (version 2 and 3): magic "GGUF", u32 version, u64 tensor count, u64 key/value count;
each key/value is a string key, a u32 type and a value (arrays: u32 element type, u64 count,
elements); each tensor is a string name, u32 dimension count, u64 dimensions, u32 type, u64
offset into the data section, which starts at the next multiple of `general.alignment`.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

# value type -> struct format of one scalar (8: string and 9: array are handled apart)
_SCALARS = {
    0: "<B",  # u8
    1: "<b",  # i8
    2: "<H",  # u16
    3: "<h",  # i16
    4: "<I",  # u32
    5: "<i",  # i32
    6: "<f",  # f32
    7: "<?",  # bool
    10: "<Q",  # u64
    11: "<q",  # i64
    12: "<d",  # f64
}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token lists, merges, scores) are skipped, only their length is kept.
KEEP_ARRAY = 4096


class GGUFError(ValueError):
    """Not a GGUF file, or one whose header is cut short."""


@dataclass(frozen=True)
class SkippedArray:
    """A long array whose elements were not read (`tokenizer.ggml.tokens` and the like)."""

    type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order (fastest-varying dimension first)
    type: int
    offset: int
    nbytes: int  # up to the next tensor's offset (padding included)


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    file_bytes: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "llama"))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}` (e.g. "block_count")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("the GGUF header is cut short")
    return data


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    return _read(f, _unpack(f, "<Q")).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, count = _unpack(f, "<I"), _unpack(f, "<Q")
        if count > KEEP_ARRAY:
            if item == _STRING:
                for _ in range(count):
                    f.seek(_unpack(f, "<Q"), 1)
            elif item in _SCALARS:
                f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
            else:
                raise GGUFError(f"array of type {item} is not supported")
            return SkippedArray(item, count)
        return [_value(f, item) for _ in range(count)]
    if kind not in _SCALARS:
        raise GGUFError(f"unknown GGUF value type {kind}")
    return _unpack(f, _SCALARS[kind])


def read_gguf(path: Path | str) -> GGUFInfo:
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        version = _unpack(f, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = _unpack(f, "<Q"), _unpack(f, "<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f)
            metadata[key] = _value(f, _unpack(f, "<I"))
        raw = []
        for _ in range(n_tensors):
            name = _string(f)
            dims = tuple(_unpack(f, "<Q") for _ in range(_unpack(f, "<I")))
            raw.append((name, dims, _unpack(f, "<I"), _unpack(f, "<Q")))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = f.tell() + (-f.tell() % alignment)
    ends = sorted({offset for *_, offset in raw} | {size - data_start})
    after = dict(itertools.pairwise(ends))
    tensors = tuple(
        TensorInfo(name, dims, kind, offset, after.get(offset, size - data_start) - offset)
        for name, dims, kind, offset in raw
    )
    return GGUFInfo(path, version, size, metadata, tensors)


__all__ = ["GGUFError", "GGUFInfo", "SkippedArray", "TensorInfo", "read_gguf"]

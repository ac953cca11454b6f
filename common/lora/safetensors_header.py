"""A safetensors file's header read directly: each tensor's dtype, shape and byte range, no torch.

The format (huggingface/safetensors): 8 bytes, the header's length N as a little-endian u64; N bytes of
JSON, `{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`, offsets
counted from the end of the header; then the data. Reading only the header lets the gateway check an
adapter's shapes without loading its weights (or torch).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

# Bytes per element of each dtype the format names.
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
# A header past this is not a small adapter's: refused before reading it into memory.
MAX_HEADER_BYTES = 100 << 20


class SafetensorsError(ValueError):
    """The file is not a readable safetensors file; the message says why."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    dtype: str  # the format's name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    begin: int  # byte offsets of its data, from the end of the header
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Every tensor of the file at `path`, by name; SafetensorsError when the file is malformed."""
    try:
        size = path.stat().st_size
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) < 8:
                raise SafetensorsError(f"{path} is not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise SafetensorsError(
                    f"{path} is not a safetensors file (a header of {length} bytes does not fit its {size})"
                )
            raw = file.read(length)
    except OSError as exc:
        raise SafetensorsError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path} is not a safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    data_bytes = size - 8 - length
    return {
        name: _tensor(path, name, entry, data_bytes)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _tensor(path: Path, name: str, entry: object, data_bytes: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise SafetensorsError(f"{path}: tensor {name!r} has no dtype/shape/data_offsets entry")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise SafetensorsError(f"{path}: tensor {name!r} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise SafetensorsError(f"{path}: tensor {name!r} has a malformed shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise SafetensorsError(f"{path}: tensor {name!r} has data offsets {offsets!r} outside the file")
    begin, end = offsets
    if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
        raise SafetensorsError(
            f"{path}: tensor {name!r} holds {end - begin} bytes, not those of a {dtype} {tuple(shape)}"
        )
    return TensorInfo(dtype=dtype, shape=tuple(shape), begin=begin, end=end)

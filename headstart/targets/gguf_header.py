"""How many bytes a GGUF file's tensors need, from its header alone (no tensor is read): a file cut
short in transit is named truncated before a converter fails on it with a reshape error."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types with a fixed size (8: string, 9: array are read apart)."""
STRING, ARRAY = 8, 9


def _read(handle: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize("<" + fmt)
    if size > 1 << 20:
        raise ValueError("an implausibly large header field")
    data = handle.read(size)
    if len(data) != size:
        raise EOFError("the header ends early")
    return struct.unpack("<" + fmt, data)


def _string(handle: BinaryIO) -> str:
    (length,) = _read(handle, "Q")
    data = handle.read(length)
    if len(data) != length:
        raise EOFError("the header ends early")
    return data.decode("utf-8", "replace")


def _value(handle: BinaryIO, kind: int) -> object:
    if kind == STRING:
        return _string(handle)
    if kind == ARRAY:
        item, count = _read(handle, "IQ")
        return [_value(handle, item) for _ in range(count)]
    if kind not in SCALARS:
        raise ValueError(f"unknown metadata type {kind}")
    return _read(handle, SCALARS[kind])[0]


def data_bytes_needed(path: Path) -> int:
    """The file size the header promises: the aligned start of the tensor data plus the end of the
    furthest tensor. Raises EOFError/ValueError/struct.error on a header that does not parse."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with path.open("rb") as handle:
        magic, _version, tensors, fields = _read(handle, "4sIQQ")
        if magic != b"GGUF":
            raise ValueError("no GGUF magic bytes")
        alignment = 32
        for _ in range(fields):
            key = _string(handle)
            value = _value(handle, _read(handle, "I")[0])
            if key == "general.alignment" and isinstance(value, int):
                if value <= 0:
                    raise ValueError(f"general.alignment is {value}")
                alignment = value
        end = 0
        for _ in range(tensors):
            _string(handle)
            (dims,) = _read(handle, "I")
            if dims > 8:  # GGML tensors have at most 4 dimensions; an untrusted count is not a format string
                raise ValueError(f"a tensor of {dims} dimensions")
            shape = _read(handle, f"{dims}Q")
            kind, offset = _read(handle, "IQ")
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            elements = 1
            for dim in shape:
                elements *= dim
            end = max(end, offset + elements // block * size)
        start = -(-handle.tell() // alignment) * alignment
    return start + end

"""Quantised weight blocks as smallmm.c reads them (Q4_1, Q8_0, bf16 rows), and their exact fp32
values (a leaf module: the kernel's calibration and gguf_blocks.py both read it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Q4_1, Q8_0, BF16 = 0, 1, 2  # smallmm.c's `kind`


@dataclass(frozen=True)
class BlockWeight:
    """One weight's blocks as smallmm.c reads them; `version` and `pointer`: the fp32 weight they
    equal (an in-place change or a swapped tensor makes them stale)."""

    kind: int
    qs: torch.Tensor  # Q4_1: (N, K/2) uint8 nibbles; Q8_0: (N, K) int8; BF16: (N, K) int16 (the bits)
    d: torch.Tensor  # (N, K/32) fp32 scales (BF16: empty)
    m: torch.Tensor | None  # (N, K/32) fp32 mins (Q4_1)
    version: int
    pointer: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def dequantise(kind: int, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """The fp32 weight (N, K) of blocks in smallmm.c's layout, computed as gguf-py does: Q4_1
    (d * q) + m with element i the low nibble of byte i and i + 16 its high one; Q8_0 d * q;
    BF16 the bits widened."""
    if kind == BF16:
        return qs.view(torch.bfloat16).float()
    rows, blocks = d.shape
    if kind == Q4_1:
        assert m is not None
        nibbles = qs.view(rows, blocks, 16).long()
        values = torch.cat([nibbles & 15, nibbles >> 4], -1).float()
        return (d[..., None] * values + m[..., None]).reshape(rows, 32 * blocks)
    return (d[..., None] * qs.view(rows, blocks, 32).float()).reshape(rows, 32 * blocks)

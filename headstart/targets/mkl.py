"""MKL's packed matmul as this PyTorch build offers it, and the row counts packs are made for
(a leaf module: the kernel's calibration and the packing both read it)."""

from __future__ import annotations

import torch

MIN_ROWS = 4  # below this MKL's small-row path is already one pass over the weights

BUCKETS = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def packed_rows(rows: int) -> int:
    """The row count to pack for: the next of `BUCKETS`. Padding rows is almost free in a
    memory-bound matmul, fewer packs mean less memory and fewer re-packs, and MKL's packed kernel
    is slow for 5-7 rows (lm_head: 29 ms, no better than unpacked, against 14 for 4 and 15 for 8)."""
    return next(b for b in BUCKETS if b >= rows)


def mkl_packing_available() -> bool:
    """MKL's packed sgemm is in this PyTorch build (x86 wheels; not macOS/ARM builds)."""
    ops = getattr(torch.ops, "mkl", None)
    try:
        return (
            bool(torch.backends.mkl.is_available())
            and ops is not None
            and (hasattr(ops, "_mkl_reorder_linear_weight") and hasattr(ops, "_mkl_linear"))
        )
    except (AttributeError, RuntimeError):
        return False

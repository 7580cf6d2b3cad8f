"""Give the C heap's free pages back to the OS during long CPU training runs.

Why: glibc raises its mmap threshold to the size of each large buffer freed (up to 32 MB), so a
loop whose tensor sizes vary from batch to batch (every padded length is a new shape) ends up
serving its big activations from the heap, which fragments and is never returned: RSS climbs
for hours. Measured on the stage-3 EAGLE-3 recipe (bf16, 1 thread): 3.3 GB after 12 steps, 6.0 GB
after 75, 11 GB at the end of an earlier run, while the live working set is ~2 GB. Pinning the
threshold low (MALLOC_MMAP_THRESHOLD_=131072) kept it at 1.5-2.0 GB but made every step ~40%
slower (fresh zeroed pages for each big tensor); `malloc_trim(0)` every few steps releases the
free pages of the heap at a fraction of that cost.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    """glibc, or None where there is no `malloc_trim` (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def trim_heap() -> bool:
    """Return the heap's free pages to the OS (glibc `malloc_trim(0)`); False where unsupported
    or nothing was released. Cost: a walk over the heap's free chunks, ~ms for a few GB."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False

"""Fast CPU matmuls for decoding forwards: a small-row kernel and pre-packed MKL weights.

Why: a decode step multiplies a handful of rows (1 token, or a verify's tree nodes) by every
weight of the target: one pass over the weights plus a little compute. PyTorch's `F.linear`
does that badly on CPUs. With MKL, past 3 rows the gemm re-packs the whole weight matrix on
every call (SmolLM2's lm_head, 1 thread: 13 ms for 1-3 rows, 26 for 4, 43 for 8), and on this
project's AMD EPYC even 1 row reaches only ~11 GB/s and a second thread adds nothing. Two fixes:

* 1 to `smallmm.MAX_ROWS` (64) rows: headstart's own kernel (`smallmm.py`): each weight row is
  streamed once with all rows' accumulators in registers, split over the threads. All of
  SmolLM2's matmuls for 8 rows: 34 ms at 1 thread, 19 at 2, against MKL's 72 and 60.
* 4 to MAX_ROWS rows when the kernel is unavailable (no C compiler), or more rows than it takes:
  weights packed once per row count by MKL (`cblas_sgemm_pack`, exposed by PyTorch as
  `torch.ops.mkl._mkl_reorder_linear_weight` / `_mkl_linear`, the ops Inductor's CPU freezing
  uses). Packs are built on first use (about 0.4 s and one extra copy of the weights, ~540 MB for
  SmolLM2); at most `keep` row counts are kept (LRU); a weight changed in place (its `_version`
  moves) is re-packed.

What it does: while a `rows(n)` context is open, every `nn.Linear` of the model with exactly `n`
input rows takes the fast path; any other row count, and anything under autograd, falls back to
`F.linear`.

Exactness: both compute on the same fp32 numbers; results differ from `F.linear` only by
summation order (~1e-6 relative), as `F.linear` with 8 rows already differs from `F.linear` with 1
row. The kernel's results do not depend on the row count at all. The greedy exactness tests run
through these paths.

Only for fp32 on CPU (with a C compiler or an MKL build); anywhere else `PackedLinears.for_model`
returns None and nothing changes. `HEADSTART_PACKED=0` turns both off, `HEADSTART_SMALLMM=0` the
kernel alone.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headstart.targets.gguf_blocks import attach_bf16, blocks_for, generation
from headstart.targets.mkl import MIN_ROWS, mkl_packing_available, packed_rows
from headstart.targets.smallmm import MAX_ROWS as SMALL_MAX_ROWS
from headstart.targets.smallmm import SmallMatmul, small_matmul

MAX_ROWS = 256  # past this a plain gemm amortises its packing; a pack would only cost memory
_SHARED: weakref.WeakKeyDictionary[nn.Module, PackedLinears] = weakref.WeakKeyDictionary()


class PackedLinears:
    """Row-count-specific MKL packs of a module's `nn.Linear` weights; see the module docstring."""

    def __init__(self, model: nn.Module, keep: int = 2) -> None:
        # a module whose forward is already an instance attribute (accelerate's offload hooks,
        # another patch) is left alone: replacing it would drop that wrapper
        self.linears = [
            m for m in model.modules() if isinstance(m, nn.Linear) and "forward" not in m.__dict__
        ]
        self.keep = keep
        self._packs: OrderedDict[int, list[tuple[torch.Tensor, int]]] = OrderedDict()
        self._bound: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], list[Any]]] = OrderedDict()

    @classmethod
    def for_model(cls, model: nn.Module) -> PackedLinears | None:
        """The model's packer, shared by every decoder on it (packs are per model, not per
        decoder), when it applies: fp32 weights on CPU, MKL present, not disabled. Else None."""
        if os.environ.get("HEADSTART_PACKED", "1") == "0":
            return None
        weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
        if not weights or any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
            return None
        if not mkl_packing_available() and small_matmul() is None:
            return None
        if model not in _SHARED:
            # decoding reads bf16-valued weights (heads stored in bf16, a bf16 checkpoint) as bf16
            # rows, same bits: attached here, where decoding starts, so training never pays the memory
            attach_bf16(model)
            _SHARED[model] = cls(model)
        return _SHARED[model]

    @contextlib.contextmanager
    def keeping(self, count: int) -> Iterator[None]:
        """Keep up to `count` buckets inside (the tuner: every candidate's), back to `keep` after."""
        before, self.keep = self.keep, max(self.keep, count)
        try:
            yield
        finally:
            self.keep = before
            while len(self._packs) > self.keep:
                self._packs.popitem(last=False)

    def _pack(self, rows: int) -> list[tuple[torch.Tensor, int]]:
        packs = self._packs.get(rows)
        stale = packs is not None and any(
            version != m.weight._version for (_, version), m in zip(packs, self.linears, strict=True)
        )
        if packs is None or stale:
            self._packs.pop(rows, None)
            while len(self._packs) >= self.keep:
                self._packs.popitem(last=False)  # cost: frees one extra copy of the weights
            reorder = torch.ops.mkl._mkl_reorder_linear_weight
            packs = [(reorder(m.weight.detach().contiguous(), rows), m.weight._version) for m in self.linears]
            self._packs[rows] = packs
        self._packs.move_to_end(rows)
        return packs

    @contextlib.contextmanager
    def rows(self, rows: int) -> Iterator[None]:
        """Inside, linears with exactly `rows` input rows use the small-row kernel (1 to
        `smallmm.MAX_ROWS` rows, when it built) or packed weights (4 to MAX_ROWS rows)."""
        kernel = small_matmul() if rows <= SMALL_MAX_ROWS else None
        if kernel is not None and rows <= kernel.max_rows:
            forwards = self._small_forwards(kernel, rows)
        elif MIN_ROWS <= rows <= MAX_ROWS and mkl_packing_available():
            padded = packed_rows(rows)
            forwards = [
                _packed_forward(module, weight, rows, padded)
                for module, (weight, _) in zip(self.linears, self._pack(padded), strict=True)
            ]
        else:
            yield
            return
        # an instance attribute shadows the class's forward until the context closes; written to
        # __dict__ directly (not a parameter, buffer or submodule): nn.Module.__setattr__ and
        # __delattr__ cost ~7 us a module, ~1.6 ms a SmolLM2 forward
        before = [module.__dict__.get("forward") for module in self.linears]  # a context around this one
        for module, forward in zip(self.linears, forwards, strict=True):
            module.__dict__["forward"] = forward
        try:
            yield
        finally:
            for module, forward in zip(self.linears, before, strict=True):
                if forward is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = forward

    def _small_forwards(self, kernel: SmallMatmul, rows: int) -> list[Any]:
        """Every linear's kernel-bound forward for `rows` rows, bound once and kept while the
        weights, the thread count, the kernel's row ranges and the attached GGUF blocks stay as they
        were. Binding all of SmolLM2's 211 linears and setting them took ~5.5 ms, a third of a 1-token forward."""
        key = (rows, torch.get_num_threads(), kernel.max_rows, kernel.block_rows, generation())
        state = tuple(_bound_state(m._parameters) for m in self.linears)
        found = self._bound.get(key)
        if found is not None and found[0] == state:
            self._bound.move_to_end(key)
            return found[1]
        forwards = [_small_forward(module, kernel, rows) for module in self.linears]
        self._bound[key] = (state, forwards)
        while len(self._bound) > 16:  # prefills bring many row counts: keep the recent ones
            self._bound.popitem(last=False)
        return forwards


@contextlib.contextmanager
def packed(packers: Iterable[PackedLinears | None], rows: int) -> Iterator[None]:
    """Run `rows`-row matmuls through each packer's packs (None entries: packing not available)."""
    with contextlib.ExitStack() as stack:
        for packer in packers:
            if packer is not None:
                stack.enter_context(packer.rows(rows))
        yield


def _bound_state(params: dict[str, Any]) -> tuple[Any, ...]:
    """What a bound forward captured of a linear: its tensors, their storage, layout and version
    (an in-place op moves `_version`; a write through `.data` does not: see gguf_blocks.detach)."""
    state: tuple[Any, ...] = ()
    for tensor in (params.get("weight"), params.get("bias")):
        if tensor is None:
            state += (None,)
        else:
            state += (
                id(tensor),
                tensor.data_ptr(),
                tensor._version,
                tensor.dtype,
                tensor.shape,
                tensor.stride(),
            )
    return state


def _small_forward(module: nn.Linear, kernel: SmallMatmul, rows: int) -> Any:
    # a GGUF target's blocks where they are kept and still equal the weight: same bits, less memory
    fast = kernel.bind(module.weight, module.bias, rows, blocks_for(module))  # None: the weight does not fit

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # the kernel has no backward
            return F.linear(x, module.weight, module.bias)
        if fast is not None and (out := fast(x)) is not None:
            return out
        flat = x.reshape(-1, module.in_features)  # e.g. strided rows: the general path, same bits
        if flat.shape[0] != rows or not kernel.fits(flat, module.weight, module.bias):
            return F.linear(x, module.weight, module.bias)
        return kernel.linear(flat, module.weight, module.bias).view(*x.shape[:-1], module.out_features)

    return forward


def _packed_forward(module: nn.Linear, packed: torch.Tensor, rows: int, padded: int) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        # packs are inference-only snapshots (MKL's packed op has no backward): never under autograd
        if x.numel() != rows * module.in_features or torch.is_grad_enabled():
            return F.linear(x, module.weight, module.bias)
        flat = x.reshape(rows, -1)
        if padded > rows:  # zero rows: free in a memory-bound matmul, and rows do not mix
            flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
        out = torch.ops.mkl._mkl_linear(flat, packed, module.weight, module.bias, padded)
        return out[:rows].view(*x.shape[:-1], module.out_features)

    return forward

"""The host-side plan of an EAGLE-3 training step: every index the unroll and the loss need,
computed on the CPU from the batch's loss mask while the batch is collated.

Which positions each training-time-test step runs at and is scored at depends only on the loss
mask, so none of it needs the device: computed there (boolean indexing, `.tolist()` of widths)
each cost a host sync per step and a data-dependent shape, 10-15 syncs a step. With the plan the
step runs on the device without waiting once, and the shapes it sees come from a few buckets
(`bucket`: widths rounded up), which a compiled step needs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from headstart.train.losses import ahead, soft_label_index


@dataclass(frozen=True)
class TTTPlan:
    """Indices for one batch (B rows of T positions) and `steps` TTT steps; see `ttt_plan`."""

    order: torch.Tensor
    """(B, T) each row's positions ordered by what reads the unroll there: first those some step
    j >= 1 scores (x_{t+2+j} a reply token), then those only step 0 scores (x_{t+2}), then the
    rest (prompt, padding), each group in position order. Prompts are most of a chat batch, and
    nothing reads the head's output there: only their keys and values."""
    first_counts: torch.Tensor
    """(B,) positions of each row that step 0 runs at (the first two groups of `order`)."""
    later_counts: torch.Tensor
    """(B,) positions of each row that steps >= 1 run at (the first group)."""
    first: int
    """Width S_0 of step 0: the most `first_counts` of a row (>= 1), rounded up to a bucket."""
    later: int
    """Width S_1 of steps >= 1, likewise."""
    needed: torch.Tensor
    """(N,) flat positions b * T + t whose target distribution some step learns (x_{t+1} a reply
    token), row-major: the label matrix's rows."""
    select: torch.Tensor
    """(M,) the scored outputs, as flat indices into the steps' outputs concatenated
    (step j's (B, S_j) block after those of the steps before it), step by step, row-major."""
    rows: torch.Tensor
    """(M,) the label row (into `needed`) each scored output learns."""
    step_of: torch.Tensor
    """(M,) the TTT step of each scored output."""
    per_step: tuple[int, ...]
    """Scored outputs per step (N_j), known on the host."""

    def to(self, device: Any, non_blocking: bool = False) -> TTTPlan:
        """The plan's tensors on `device` (accelerate moves a batch's values with `.to`)."""
        return self._map(lambda x: x.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TTTPlan:
        """The plan's tensors in pinned host memory (the DataLoader's pin_memory calls it)."""
        return self._map(lambda x: x.pin_memory())

    def _map(self, move: Any) -> TTTPlan:
        return replace(self, **{f.name: move(getattr(self, f.name)) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})  # fmt: skip

    @property
    def widths(self) -> list[int]:
        """S_j of every step."""
        return [self.first] + [self.later] * (len(self.per_step) - 1)


def round_up(width: int, bucket: int, limit: int) -> int:
    """`width` rounded up to a multiple of `bucket` (1: as is), at most `limit`."""
    return min(-(-width // bucket) * bucket, limit) if bucket > 1 else width


def ttt_plan(loss_mask: torch.Tensor, steps: int, bucket: int = 1) -> TTTPlan:
    """The plan for `loss_mask` (B, T) on the CPU (a device mask is copied: one sync).

    Step j at t predicts x_{t+2+j} and is scored where that token is a reply token; it learns
    the target's distribution at t+1+j (`losses` module doc). Step 0 runs at every position some
    step scores (later steps read its output), steps >= 1 where a later step scores."""
    mask = loss_mask.detach().to("cpu", torch.long)
    batch, length = mask.shape
    later = torch.zeros(mask.shape, dtype=torch.bool)
    for j in range(1, steps):
        later |= ahead(mask, 2 + j).bool()
    first = later | ahead(mask, 2).bool()
    rank = (~first).to(torch.int8) + (~later).to(torch.int8)  # 0 later, 1 step 0 only, 2 neither
    order = torch.argsort(rank, dim=1, stable=True)
    first_counts, later_counts = first.sum(1), later.sum(1)
    # at most T - 2: positions T-2 and T-1 score nothing (no x_{t+2}), so at least two positions
    # always only cache keys and values, a structure that never changes (compiled: no shape of
    # the step collapses to 0 or 1, which dynamic shapes would specialise on)
    limit = max(length - 2, 1)
    widths = [
        round_up(max(int(c.max()) if batch else 0, 1), bucket, limit) for c in (first_counts, later_counts)
    ]
    index = soft_label_index(ahead(mask, 1).bool())  # (B, T): label row, -1 where none
    select, rows, step_of, per_step, offset = [], [], [], [], 0
    for j in range(steps):
        width = widths[0] if j == 0 else widths[1]
        at = order[:, :width]  # (B, S_j)
        real = torch.arange(width)[None] < (first_counts if j == 0 else later_counts)[:, None]
        where = ahead(mask, 2 + j).bool().gather(1, at) & real  # (B, S_j): scored here
        flat = where.flatten().nonzero().flatten()
        select.append(flat + offset)
        rows.append(ahead(index, 1 + j).gather(1, at).flatten()[flat])
        step_of.append(torch.full((flat.numel(),), j, dtype=torch.long))
        per_step.append(flat.numel())
        offset += batch * width
    return TTTPlan(
        order=order,
        first_counts=first_counts,
        later_counts=later_counts,
        first=widths[0],
        later=widths[1],
        needed=ahead(mask, 1).bool().flatten().nonzero().flatten(),
        select=torch.cat(select),
        rows=torch.cat(rows),
        step_of=torch.cat(step_of),
        per_step=tuple(per_step),
    )

"""DFlash training: anchored blocks at random reply positions, every slot scored at once.

A block anchored at position a holds the known token x_a and mask tokens; it sees the target's
features at positions < a, so slot k (1..B-1) guesses x_{a+k} from the same information the
drafter has at inference (the target has read x_0..x_{a-1}, x_a is the bonus token). Anchors are
positions whose next token is a reply token (`candidates`): the EAGLE-3 evaluation's positions,
so held-out figures compare step for step (slot k = EAGLE step k-1). The label of slot k is the
target's distribution at a+k-1 (soft, restricted to the draft vocabulary) or the token x_{a+k}
(hard), scored where x_{a+k} is a reply token; slot k weighs exp(-(k-1)/gamma) (DFlash's decay).
"""

from __future__ import annotations

import torch

from headstart.train.losses import ahead


def candidates(loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: positions a >= 1 whose next token x_{a+1} is a reply token."""
    found = ahead(loss_mask, 1).bool()
    found[:, 0] = False  # a block needs context before its anchor
    return found


def sample_anchors(loss_mask: torch.Tensor, count: int, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Up to `count` anchors per row, uniformly without replacement among the candidates, sorted:
    (anchors (B, N), real (B, N)); rows with fewer candidates pad with position 0, not real.
    Consumes the global RNG (or `generator`) on the mask's device."""
    allowed = candidates(loss_mask)
    scores = torch.rand(allowed.shape, device=allowed.device, generator=generator)
    scores = scores.masked_fill(~allowed, -1.0)
    count = min(count, allowed.shape[1])
    top, index = scores.topk(count, dim=1)
    real = top >= 0
    anchors = torch.where(real, index, 0)
    order = torch.where(real, anchors, anchors.new_full((), allowed.shape[1])).argsort(dim=1)
    return anchors.gather(1, order), real.gather(1, order)


def all_anchors(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every candidate as an anchor (held-out evaluation): (anchors (B, N), real (B, N))."""
    allowed = candidates(loss_mask)
    width = max(int(allowed.sum(1).max()), 1)  # host sync: the widest row
    rank = torch.where(allowed, torch.arange(allowed.shape[1], device=allowed.device), allowed.shape[1])
    anchors = rank.sort(dim=1).values[:, :width]
    real = anchors < allowed.shape[1]
    return torch.where(real, anchors, 0), real


def slot_targets(anchors: torch.Tensor, real: torch.Tensor, loss_mask: torch.Tensor, size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """For slots 1..size-1 of each block: the position of its token x_{a+k} (B, N, size-1),
    clamped inside the row, and whether that slot is scored (a real anchor, inside the row, and
    x_{a+k} a reply token)."""
    length = loss_mask.shape[1]
    at = anchors[..., None] + torch.arange(1, size, device=anchors.device)  # (B, N, S-1)
    inside = at < length
    at = at.clamp_max(length - 1)
    scored = real[..., None] & inside & loss_mask.gather(1, at.flatten(1)).view(at.shape).bool()
    return at, scored


def slot_weights(size: int, gamma: float, device: torch.device) -> torch.Tensor:
    """exp(-(k-1)/gamma) for slots k = 1..size-1, (size-1,)."""
    return torch.exp(-torch.arange(size - 1, dtype=torch.float32, device=device) / gamma)


def weighted_block_loss(per_slot: torch.Tensor, scored: torch.Tensor, weights: torch.Tensor,
                        total_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """per_slot (B, N, S-1) losses -> (sum of w_k * loss / sum of w_k over scored slots, the mean
    loss of each slot (S-1,) for the log). `total_weight`: the denominator averaged over processes
    (shared_total), so DDP's gradient average is the global weighted mean."""
    w = weights * scored  # (B, N, S-1)
    denominator = total_weight if total_weight is not None else w.sum()
    loss = (per_slot * w).sum() / denominator.clamp_min(1e-9)
    counts = scored.sum((0, 1)).clamp_min(1)
    parts = (per_slot * scored).sum((0, 1)).detach() / counts
    return loss, parts


def shared_total(value: torch.Tensor) -> torch.Tensor | None:
    """`value` averaged over processes (None in one process); see objective.shared_counts."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    total = value.detach().to(torch.float32).clone()
    dist.all_reduce(total)  # cost: one small collective per micro-batch
    return total / dist.get_world_size()


PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
"""DFlash's decay by block size, as its paper trains them."""


def default_gamma(size: int) -> float:
    """The paper's gamma for its block sizes, size / 2.3 for others."""
    return PAPER_GAMMA.get(size, max(1.0, round(size / 2.3, 1)))

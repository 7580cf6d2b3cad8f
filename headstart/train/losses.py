"""Losses and held-out statistics as pure functions of tensors (no modules, no state).

Alignment (headstart.heads.base): tokens x_0..x_{T-1}, target features f_t and logits z_t (z_t
predicts x_{t+1}); loss_mask[s] = 1 when x_s is a reply token to learn. Every per-position tensor
here is aligned to the query position t of the head, padded with zeros on the right by `ahead`:
    Medusa head i (0-based) at t predicts x_{t+2+i}; the target's own guess of it is z_{t+1+i}.
    EAGLE unroll step j at t predicts x_{t+2+j}, trained towards z_{t+1+j} (soft labels).
A prediction counts when its predicted token is a reply token: mask = ahead(loss_mask, 2 + i).
Optional `count(s)` arguments replace the local token counts of each term (see masked_mean).
What only one kind uses lives with its objective (train/objectives/<kind>).
"""

from __future__ import annotations

import torch


def ahead(x: torch.Tensor, shift: int) -> torch.Tensor:
    """x[:, t + shift] at position t, zero past the end; x is (B, T, ...)."""
    if shift == 0:
        return x
    rest = x[:, shift:]
    pad = torch.zeros((x.shape[0], min(shift, x.shape[1]), *x.shape[2:]), dtype=x.dtype, device=x.device)
    return torch.cat([rest, pad], dim=1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of `values` (B, T) where mask (B, T) is 1; 0 when nothing is selected.
    `count` replaces the local number of selected positions (distributed training passes the
    global count / processes, so averaging the processes' losses gives the global token mean)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / (mask.sum() if count is None else count).clamp(min=1.0)


def soft_ce_probs(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """-sum_v target_probs * log_softmax(logits) per position: (..., V) x2 -> (...)."""
    return -(target_probs * logits.float().log_softmax(-1)).sum(-1)


def scored(loss_mask: torch.Tensor, shifts: list[int]) -> list[torch.Tensor]:
    """Where each term is scored, (B, T) bool per shift: ahead(loss_mask, s) (see the module doc)."""
    return [ahead(loss_mask, s).bool() for s in shifts]


def mean_at(total: torch.Tensor, selected: int, count: torch.Tensor | None = None) -> torch.Tensor:
    """`total` summed over `selected` scored positions -> their mean; `count` as in masked_mean."""
    denom = torch.as_tensor(float(selected), device=total.device) if count is None else count
    return total / denom.clamp(min=1.0)


def decayed_sum(per_term: torch.Tensor, decay: float) -> torch.Tensor:
    """sum_i decay**i * per_term[i] (heads / TTT steps further ahead weigh less)."""
    weights = decay ** torch.arange(per_term.shape[0], device=per_term.device, dtype=per_term.dtype)
    return (weights * per_term).sum()


def soft_label_index(needed: torch.Tensor) -> torch.Tensor:
    """(B, T) row of each needed position in the compacted label matrix (row-major), -1 elsewhere.

    EAGLE-3 step j at t learns the target's distribution at s = t+1+j, and it is scored only when
    x_{t+2+j} = x_{s+1} is a reply token: every step needs the labels at the same positions
    (needed = ahead(loss_mask, 1)), so they are projected and normalised once, not once per step."""
    flat = needed.flatten()
    return (flat.cumsum(0) - 1).masked_fill(~flat, -1).view(needed.shape)  # no host sync


def draft_hits(
    step_target_ids: list[torch.Tensor], target_argmax: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Held-out counts per conversation and step/head: (B, S, 1 + K, 3) rows of [top-1 hits,
    top-k hits, predictions], first over every position, then per context bucket of the position
    drafted from (`bucket_counts`; per conversation so a distributed eval can drop padded
    duplicates).

    step_target_ids[j]: (B, T, k) the draft's top-k guesses at step/head j, as TARGET ids, best
    first; target_argmax (B, T): the target's greedy token z_t.argmax(). Stays on device."""
    rows = []
    positions = torch.arange(target_argmax.shape[1], device=target_argmax.device).expand_as(target_argmax)
    for j, top in enumerate(step_target_ids):
        want = ahead(target_argmax, 1 + j)  # (B, T)
        mask = ahead(loss_mask, 2 + j).bool()
        hit1 = (top[..., 0] == want) & mask
        hitk = (top == want[..., None]).any(-1) & mask
        rows.append(bucket_counts(torch.stack([hit1, hitk, mask], dim=-1), positions))  # (B, 1 + K, 3)
    return torch.stack(rows, dim=1)


def bucket_counts(flags: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """flags (B, N, 3) bool counted per conversation: (B, 1 + K, 3), the sums over all N, then per
    context bucket of `positions` (B, N) (inference/results.py's POSITION_BUCKETS, then "2k+":
    bench's buckets, so training's held-out figures and a decode's read alike). float64."""
    from headstart.inference.results import POSITION_BUCKETS

    edges = torch.tensor([bound for bound, _ in POSITION_BUCKETS], device=positions.device)
    onehot = torch.nn.functional.one_hot(
        torch.bucketize(positions.contiguous(), edges, right=True), len(edges) + 1
    )
    per_bucket = torch.einsum("bnc,bnk->bkc", flags.to(torch.float64), onehot.to(torch.float64))
    return torch.cat([flags.to(torch.float64).sum(1, keepdim=True), per_bucket], dim=1)


def bucket_names() -> list[str]:
    """The names of `bucket_counts`' buckets, in order."""
    from headstart.inference.results import POSITION_BUCKETS

    return [name for _, name in POSITION_BUCKETS] + ["2k+"]


def acceptance_length(top1: list[float]) -> float:
    """Estimated tokens per target forward for a chain draft, bonus token included:
    1 + sum_j prod_{i<=j} acc_i (treats step j's accuracy as conditional on earlier steps)."""
    tau, run = 1.0, 1.0
    for acc in top1:
        run *= acc
        tau += run
    return tau

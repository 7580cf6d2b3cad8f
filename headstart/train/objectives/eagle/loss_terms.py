"""EAGLE's losses as pure functions of tensors: EAGLE-1's feature regression and soft CE, EAGLE-3's
training-time test (alignment: headstart/train/losses.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headstart.train.losses import (
    ahead,
    decayed_sum,
    masked_mean,
    mean_at,
    scored,
    soft_ce_probs,
    soft_label_index,
)


def soft_ce(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """-sum_v softmax(target) * log_softmax(logits) per position: (B, T, V) x2 -> (B, T)."""
    return soft_ce_probs(logits, target_logits.float().softmax(-1))


def eagle1_loss(
    g: torch.Tensor,
    head_logits: torch.Tensor,
    target_hidden: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    feature_weight: float,
    ce_weight: float,
    count: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-1: SmoothL1(g_t, f_{t+1}) * feature_weight + soft CE(head, z_{t+1}) * ce_weight.
    g, target_hidden (B, T, H); logits (B, T, V). Returns (loss, feature loss, CE)."""
    mask = ahead(loss_mask, 2)
    feature = F.smooth_l1_loss(g.float(), ahead(target_hidden, 1).float(), reduction="none").mean(
        -1
    )  # (B, T)
    feature = masked_mean(feature, mask, count)
    ce = masked_mean(soft_ce(head_logits, ahead(target_logits, 1)), mask, count)
    return feature_weight * feature + ce_weight * ce, feature.detach(), ce.detach()


def ttt_loss(
    step_logits: list[torch.Tensor],
    target_draft_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3 training-time test: sum_j decay**j * soft CE(step j, z_{t+1+j} over the draft vocab).
    step_logits: per step (B, T, Vd); target_draft_logits (B, T, Vd) = the target's logits at the
    draft vocabulary (softmax over them = the target's distribution restricted and renormalised)."""
    needed = ahead(loss_mask, 1).bool()
    index = soft_label_index(needed)
    where = scored(loss_mask, [2 + j for j in range(len(step_logits))])
    return ttt_loss_at(
        [lg[w] for lg, w in zip(step_logits, where, strict=True)],
        target_draft_logits[needed].float().softmax(-1),
        [ahead(index, 1 + j)[w] for j, w in enumerate(where)],
        decay,
        counts,
    )


def ttt_loss_at(
    step_logits: list[torch.Tensor],
    target_probs: torch.Tensor,
    rows: list[torch.Tensor],
    decay: float,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ttt_loss` on the scored positions only: step j's draft logits there (N_j, Vd), the target's
    draft-vocabulary distribution at the needed positions (N, Vd) and, per step, the label row of
    each scored position (N_j,) (`soft_label_index`). Training calls this directly."""
    per_step = torch.stack(
        [
            mean_at(
                soft_ce_probs(lg, target_probs[r]).sum(), r.shape[0], None if counts is None else counts[j]
            )
            for j, (lg, r) in enumerate(zip(step_logits, rows, strict=True))
        ]
    )
    return decayed_sum(per_step, decay), per_step.detach()

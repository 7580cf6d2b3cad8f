"""Medusa's training objective (head.kind=medusa, and Medusa-2 with lora.enabled)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from headstart.errors import HeadstartError
from headstart.targets.features import Features
from headstart.train import losses
from headstart.train.losses import ahead, decayed_sum, masked_mean, mean_at, scored
from headstart.train.objective import shared_counts


@dataclass
class MedusaLoss:
    """Medusa's `loss.*` keys (cfg.loss for head.kind=medusa)."""

    medusa_decay: float = 0.8
    """Head k (0-based) weighs decay**k."""

    def __post_init__(self) -> None:
        if self.medusa_decay < 0:
            raise HeadstartError(
                f"loss.medusa_decay must be >= 0, got {self.medusa_decay}", "set loss.medusa_decay=0.8"
            )


def per_head_ce(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa-1: sum_i decay**i * CE(head i, x_{t+2+i}). logits (K, B, T, V) -> (loss, per-head CE (K,))."""
    where = scored(loss_mask, [2 + i for i in range(logits.shape[0])])
    return per_head_ce_at(
        [logits[i][w] for i, w in enumerate(where)],
        [ahead(input_ids, 2 + i)[w] for i, w in enumerate(where)],
        decay,
        counts,
    )


def per_head_ce_at(
    head_logits: list[torch.Tensor],
    labels: list[torch.Tensor],
    decay: float,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`per_head_ce` on the scored positions only: head i's logits (N_i, V) and labels (N_i,).
    Training calls this directly, so the heads never project unscored positions (prompt tokens)
    through the V x H vocabulary matrix."""
    per_head = torch.stack(
        [
            mean_at(
                F.cross_entropy(lg.float(), y, reduction="sum"),
                y.numel(),
                None if counts is None else counts[i],
            )
            for i, (lg, y) in enumerate(zip(head_logits, labels, strict=True))
        ]
    )
    return decayed_sum(per_head, decay), per_head.detach()


def medusa_loss(
    objective: Any, feats: Features, batch: dict[str, Any], evaluate: bool, joint: bool
) -> dict[str, torch.Tensor]:
    """Medusa-1: each head's CE at the token it drafts, decayed by depth; Medusa-2 (a LoRA target)
    adds the target's own loss once joint training starts."""
    ids, mask = batch["input_ids"], batch["loss_mask"]
    heads = objective.head.num_heads
    counts = shared_counts(mask, [2 + i for i in range(heads)] + [1])  # heads, then LM
    head_counts, lm_count = (None, None) if counts is None else (counts[:-1], counts[-1])
    decay = objective.cfg.loss.medusa_decay
    if evaluate:  # every position: the hit counts need each head's top-k everywhere
        logits = objective.head(feats.last_hidden)  # (K, B, T, V)
        loss, per_head = per_head_ce(logits, ids, mask, decay, head_counts)
    else:  # cost: each head's V x H projection runs on the positions it is scored at only
        where = losses.scored(mask, [2 + i for i in range(heads)])
        loss, per_head = per_head_ce_at(
            [objective.head.head_logits(i, feats.last_hidden[w]) for i, w in enumerate(where)],
            [ahead(ids, 2 + i)[w] for i, w in enumerate(where)],
            decay,
            head_counts,
        )
    out = {"loss": loss, "parts": per_head}
    if objective.trains_target:  # Medusa-2: also log the target's own loss during warm-up
        lm = lm_loss(feats.logits, ids, mask, lm_count)
        out["parts"] = torch.cat([per_head, lm.detach()[None]])
        if joint:  # after warm-up the target trains through its LoRA adapters
            out["loss"] = objective.cfg.lora.lm_weight * lm + objective.cfg.lora.heads_weight * loss
    if evaluate:
        if getattr(objective.head, "has_draft_vocab", False):  # score what drafting can propose
            logits = logits.masked_fill(~objective.head.t2d, float("-inf"))
        top = logits.topk(objective.cfg.topk, dim=-1).indices  # (K, B, T, k), already target ids
        out["hits"] = losses.draft_hits(list(top), feats.logits.argmax(-1), mask)
    return out


medusa_loss.parts = lambda cfg: (
    [f"ce/head{k + 1}" for k in range(cfg.head.num_heads)]
    + (  # type: ignore[attr-defined]
        ["lm_loss"] if cfg.lora.enabled else []
    )
)


def lm_loss(
    target_logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target's own next-token CE on reply tokens (Medusa-2's joint term, through LoRA)."""
    return masked_mean(token_ce(target_logits, ahead(input_ids, 1)), ahead(loss_mask, 1), count)


def token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per position: logits (B, T, V), labels (B, T) -> (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view(
        labels.shape
    )

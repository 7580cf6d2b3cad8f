"""The draft model's training objective (head.kind=draft): at every answer position, the KL
divergence from the target's next-token distribution to the draft's (DistillSpec's forward KL:
the draft learns where the target puts its mass, which is what acceptance rewards)."""

from __future__ import annotations

from typing import Any

import torch

from headstart.targets.features import Features
from headstart.train import losses
from headstart.train.losses import ahead


def draft_loss(
    objective: Any, feats: Features, batch: dict[str, Any], evaluate: bool, joint: bool
) -> dict[str, torch.Tensor]:
    """Position t predicts x_{t+1}: scored where x_{t+1} is an answer token. Held out, the hits
    are the draft's top-k at t + 1 against the target's greedy token there (one draft step)."""
    ids, mask = batch["input_ids"], batch["loss_mask"]
    head = objective.head
    hidden = head(ids)  # (B, T, H)
    where = losses.scored(mask, [1])[0]  # (B, T)
    # cost: both V x H projections run on the scored positions only (answers, not prompts)
    draft = head.logits(hidden[where]).float().log_softmax(-1)  # (N, V)
    target = objective.target_logits_at(feats.last_hidden[where], head).float().log_softmax(-1)
    per_token = (target.exp() * (target - draft)).sum(-1)  # (N,)
    loss = per_token.mean() if per_token.numel() else hidden.sum() * 0.0
    out = {"loss": loss, "parts": loss.detach()[None]}
    if evaluate:
        with torch.no_grad():
            top = head.logits(hidden).topk(objective.cfg.topk, dim=-1).indices  # (B, T, k)
        out["hits"] = losses.draft_hits([ahead(top, 1)], feats.logits.argmax(-1), mask)
    return out


draft_loss.parts = lambda cfg: ["kl"]  # type: ignore[attr-defined]

"""DFlash's training objective: blocks at sampled anchors, each slot's loss weighted by its depth.
This folder holds everything DFlash's training needs that no other kind does (block.py: the
anchors, the block's inputs and masks, the slot weights)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from headstart.config import EVALUATION_ONLY
from headstart.errors import HeadstartError
from headstart.targets.features import Features
from headstart.train import losses
from headstart.train.losses import ahead
from headstart.train.objectives.dflash import block


@dataclass
class DFlashLoss:
    """DFlash's `loss.*` keys (cfg.loss for head.kind=dflash)."""

    dflash_anchors: int = 32
    """Blocks per conversation in a training step, anchored at random reply positions (cost:
    anchors x block_size queries through the draft layers and the lm_head rows)."""
    dflash_decay: float = 0.0
    """Slot k (1..B-1) weighs exp(-(k-1)/gamma); 0 = the paper's gamma for the block size (7 for
    16, 5 for 10, 4 for 8)."""
    dflash_labels: Literal["soft", "hard"] = "soft"
    """soft = the target's distribution at the slot (over the draft vocabulary), as EAGLE-3 trains
    here; hard = the data's token (z-lab's and SpecForge's recipe)."""
    eval_ttt_steps: int = field(default=0, metadata=EVALUATION_ONLY)
    """Held-out metrics: score this many draft steps (0 = block_size - 1). Set it to compare heads
    of different kinds on the same held-out steps (experiments/smollm2-ablations/ablate_smollm2.sh)."""

    def __post_init__(self) -> None:
        if self.dflash_anchors < 1 or self.dflash_decay < 0 or self.eval_ttt_steps < 0:
            raise HeadstartError(
                f"loss.dflash_anchors must be >= 1, loss.dflash_decay and loss.eval_ttt_steps >= 0, got "
                f"{self.dflash_anchors}, {self.dflash_decay}, {self.eval_ttt_steps}",
                "set loss.dflash_anchors=32 and loss.dflash_decay=0 (the paper's decay)",
            )


def dflash_loss(
    objective: Any, feats: Features, batch: dict[str, Any], evaluate: bool, joint: bool = False
) -> dict[str, torch.Tensor]:
    """DFlash: blocks at sampled anchors (every candidate when evaluating, in chunks), each
    slot's loss weighted by its depth (block.py beside it)."""
    head, cfg = objective.head, objective.cfg.loss
    ids, mask = batch["input_ids"], batch["loss_mask"]
    g = head.fuse(feats.last_hidden, feats.layers)  # (B, T, H)
    length = ids.shape[1]
    context = torch.arange(length, device=ids.device).expand(ids.shape[0], length)
    visible = context < batch["lengths"].to(ids.device)[:, None]  # right padding is not context
    if evaluate:
        anchors, real = block.all_anchors(mask)
    else:
        anchors, real = block.sample_anchors(mask, cfg.dflash_anchors)
    size = head.block_size
    weights = block.slot_weights(size, cfg.dflash_decay or block.default_gamma(size), g.device)
    needed = ahead(mask, 1).bool()  # positions whose next token is a reply token: the labels
    index = losses.soft_label_index(needed)
    soft = cfg.dflash_labels == "soft" or evaluate
    probs = (objective.target_logits_at(feats.last_hidden[needed], head).float().softmax(-1)
             if soft else None)  # fmt: skip
    depth = (cfg.eval_ttt_steps or size - 1) if evaluate else size - 1
    chunk = anchors.shape[1] if not evaluate else max(1, 4096 // size)  # bounded eval memory
    per_slot, scored, tops = [], [], []
    for start in range(0, anchors.shape[1], chunk):
        at, ok = anchors[:, start : start + chunk], real[:, start : start + chunk]
        states = head.draft_states(g, context, visible, at, ids.gather(1, at))[:, :, 1:]  # (B, N, S-1, H)
        where, hit = block.slot_targets(at, ok, mask, size)  # (B, N, S-1)
        # cost: the lm_head (Vd x H) runs on the scored slots only
        logits = head.logits(states[hit])  # (M, Vd)
        per_slot.append(slot_loss(head, logits, where, hit, ids, index, probs, soft))
        scored.append(hit)
        if evaluate:
            top = torch.full((*hit.shape, objective.cfg.topk), -1, dtype=torch.long, device=hit.device)
            top[hit] = head.draft_to_target(logits.topk(objective.cfg.topk, dim=-1).indices)
            tops.append((top[:, :, :depth], where[:, :, :depth], hit[:, :, :depth]))
    total = torch.cat(scored, dim=1)
    loss, parts = block.weighted_block_loss(
        torch.cat(per_slot, dim=1), total, weights, block.shared_total((weights * total).sum())
    )
    out = {"loss": loss, "parts": parts}
    if evaluate:
        out["hits"] = block_hits(tops, feats.logits.argmax(-1), depth)
    return out


dflash_loss.parts = lambda cfg: [f"ce/slot{k}" for k in range(1, cfg.head.block_size)]  # type: ignore[attr-defined]


def slot_loss(head: Any, logits: torch.Tensor, where: torch.Tensor, hit: torch.Tensor, ids: torch.Tensor,
               index: torch.Tensor, probs: torch.Tensor | None, soft: bool) -> torch.Tensor:  # fmt: skip
    """Each slot's loss (B, N, S-1), 0 where not scored; `logits` (M, Vd) are the scored
    slots'. Soft: CE against the target's distribution at a+k-1 (its row of `probs`); hard:
    CE against the token x_{a+k}, 0 when that token is outside the draft vocabulary."""
    chosen = logits.float()
    if soft:
        assert probs is not None
        rows = index.gather(1, (where - 1).flatten(1)).view(where.shape)[hit]
        ce = losses.soft_ce_probs(chosen, probs[rows])
    else:
        labels = ids.gather(1, where.flatten(1)).view(where.shape)[hit]
        inside = head.t2d[labels] if head.has_draft_vocab else torch.ones_like(labels, dtype=torch.bool)
        if head.has_draft_vocab:  # target ids -> draft ids; tokens outside it teach nothing
            labels = torch.where(inside, head.t2d.long().cumsum(0)[labels] - 1, 0)
        ce = torch.nn.functional.cross_entropy(chosen, labels, reduction="none") * inside
    out = torch.zeros(hit.shape, dtype=ce.dtype, device=ce.device)
    return out.index_put((hit,), ce)


def block_hits(tops: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], target_argmax: torch.Tensor,
               depth: int) -> torch.Tensor:  # fmt: skip
    """Held-out counts (B, depth, 1 + K, 3) of [top-1 hits, top-k hits, predictions], depth j =
    slot j+1, against the target's greedy token there, over all positions then per context bucket
    (`losses.draft_hits`' layout: step j of EAGLE-3)."""
    from headstart.train.losses import bucket_counts

    rows = []
    for j in range(depth):
        counts = 0
        for top, where, scored in tops:
            at = (where[:, :, j] - 1).clamp_min(0)  # (B, N): z at a+j
            want = target_argmax.gather(1, at)
            ok = scored[:, :, j]
            hit1 = (top[:, :, j, 0] == want) & ok
            hitk = (top[:, :, j] == want[..., None]).any(-1) & ok
            counts = counts + bucket_counts(torch.stack([hit1, hitk, ok], dim=-1), at)
        rows.append(counts)  # (B, 1 + K, 3)
    return torch.stack(rows, dim=1)

"""EAGLE's training objectives: EAGLE-1 (SmoothL1 on the next feature + CE through the target's
lm_head) and EAGLE-3 (training-time test: the head unrolled on its own outputs, soft CE and TV
against the target's draft-vocabulary distribution at every step).

This folder holds everything EAGLE's training needs that no other kind does: the unroll
(unroll.py), the host-side plan of a training step (plan.py), the fused chunked TTT loss
(fused.py) and the loss maths (loss_terms.py); headstart/train/losses.py keeps what kinds share."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from headstart.config import EVALUATION_ONLY
from headstart.errors import HeadstartError
from headstart.targets.features import Features
from headstart.train import losses
from headstart.train.compiled import compiled
from headstart.train.objective import shared_counts
from headstart.train.objectives.eagle import loss_terms as eagle_losses
from headstart.train.objectives.eagle.fused import fused_ttt_loss
from headstart.train.objectives.eagle.plan import ttt_plan
from headstart.train.objectives.eagle.unroll import unroll, unroll_scored


@dataclass
class EagleLoss:
    """EAGLE-1's `loss.*` keys (cfg.loss for head.kind=eagle)."""

    eagle_feature_weight: float = 1.0
    """Weight of the SmoothL1 feature-regression loss."""
    eagle_ce_weight: float = 0.1
    """Weight of the cross-entropy against the target's next-token distribution."""
    eagle_noise: float = 0.2
    """Uniform noise U(-noise/2, noise/2) added to input features while training."""
    eval_steps: int = field(default=5, metadata=EVALUATION_ONLY)
    """Held-out metrics: unroll this many steps."""

    def __post_init__(self) -> None:
        at_least(self, ("eagle_feature_weight", "eagle_ce_weight", "eagle_noise"), 0)
        at_least(self, ("eval_steps",), 1)


@dataclass
class Eagle3Loss:
    """EAGLE-3's `loss.*` keys (cfg.loss for head.kind=eagle3)."""

    ttt_steps: int = 7
    """Training-time-test unroll length (the head runs on its own outputs)."""
    ttt_decay: float = 0.8
    """Step j weighs decay**j."""
    kl_weight: float = 1.0
    """Weight of the soft cross-entropy against the target's draft-vocabulary distribution
    (forward KL up to a constant), the EAGLE-3 release's loss."""
    tv_weight: float = 0.0
    """Weight of the total-variation distance 0.5 * sum |p - q| between the target's and the
    draft's draft-vocabulary distributions. 1 - TV is the chance a sampled draft token is
    accepted, so this loss aims at acceptance directly; kl_weight=0 tv_weight=1 trains on it alone."""
    eval_ttt_steps: int = field(default=0, metadata=EVALUATION_ONLY)
    """Held-out metrics: score this many draft steps (0 = ttt_steps). Set it to compare heads
    trained at different depths, or of different kinds, on the same held-out steps
    (experiments/smollm2-ablations/ablate_smollm2.sh)."""

    def __post_init__(self) -> None:
        at_least(self, ("ttt_decay", "kl_weight", "tv_weight", "eval_ttt_steps"), 0)
        at_least(self, ("ttt_steps",), 1)
        if self.kl_weight + self.tv_weight <= 0:
            raise HeadstartError(
                "loss.kl_weight and loss.tv_weight are both 0: the EAGLE-3 loss would be 0",
                "set loss.kl_weight=1 (and loss.tv_weight=0, the default)",
            )


def at_least(section: Any, names: tuple[str, ...], least: float) -> None:
    for name in names:
        if getattr(section, name) < least:
            raise HeadstartError(
                f"loss.{name} must be >= {least}, got {getattr(section, name)}",
                f"set loss.{name}={getattr(type(section), name)}",
            )


def eagle1_loss(
    objective: Any, feats: Features, batch: dict[str, Any], evaluate: bool, joint: bool = False
) -> dict[str, torch.Tensor]:
    """EAGLE-1: the head's guess of the next feature (SmoothL1) and its token (CE through the
    target's lm_head); noise on the input feature while training."""
    head, cfg = objective.head, objective.cfg.loss
    ids, mask = batch["input_ids"], batch["loss_mask"]
    h0 = head.fuse(feats.last_hidden, feats.layers)
    if not evaluate and cfg.eagle_noise > 0:
        h0 = h0 + (torch.rand_like(h0) - 0.5) * cfg.eagle_noise  # consumes the global RNG
    steps = unroll(head, h0, ids, cfg.eval_steps if evaluate else 1)
    counts = shared_counts(mask, [2])
    loss, feature, ce = eagle_losses.eagle1_loss(
        steps[0], head.logits(steps[0]), feats.last_hidden, feats.logits, mask, cfg.eagle_feature_weight,
        cfg.eagle_ce_weight, None if counts is None else counts[0],
    )  # fmt: skip
    out = {"loss": loss, "parts": torch.stack([feature, ce])}
    if evaluate:
        out["hits"] = _hits(objective, [head.logits(g) for g in steps], feats, mask)
    return out


eagle1_loss.full_logits = True  # type: ignore[attr-defined]  # its CE reads the target's logits everywhere
eagle1_loss.parts = lambda cfg: ["feature_loss", "ce"]  # type: ignore[attr-defined]


def eagle3_loss(
    objective: Any, feats: Features, batch: dict[str, Any], evaluate: bool, joint: bool = False
) -> dict[str, torch.Tensor]:
    """EAGLE-3's training-time test over `loss.ttt_steps` unrolled steps (evaluation: every position,
    `loss.eval_ttt_steps` deep, with the hit counts)."""
    head, cfg = objective.head, objective.cfg.loss
    ids, mask = batch["input_ids"], batch["loss_mask"]
    h0 = head.fuse(feats.last_hidden, feats.layers)
    depth = (cfg.eval_ttt_steps or cfg.ttt_steps) if evaluate else cfg.ttt_steps
    counts = shared_counts(mask, [2 + j for j in range(depth)])
    if not evaluate:
        loss, per_step = ttt_train_loss(objective, h0, feats, batch, counts)
        return {"loss": loss, "parts": per_step}
    steps = unroll(head, h0, ids, depth)  # every position: the hit counts need each step's top-k
    target_draft = feats.logits[..., head.draft_ids()]  # (B, T, Vd)
    step_logits = [head.logits(g) for g in steps]  # per step (B, T, Vd)
    loss, per_step = eagle_losses.ttt_loss(step_logits, target_draft, mask, cfg.ttt_decay, counts)
    return {"loss": loss, "parts": per_step, "hits": _hits(objective, step_logits, feats, mask)}


# packed rows (data.pack): step j's label lies 2 + j positions ahead of its query
eagle3_loss.pack_margin = lambda cfg: 2 + cfg.loss.ttt_steps  # type: ignore[attr-defined]
eagle3_loss.parts = lambda cfg: [f"ce/step{j}" for j in range(cfg.loss.ttt_steps)]  # type: ignore[attr-defined]
# the step's indices planned on the host by the collate (widths in buckets of 16 when compiled: no
# width of 1, which dynamic shapes specialise on)
eagle3_loss.planner = lambda cfg: partial(ttt_plan, steps=cfg.loss.ttt_steps, bucket=16 if cfg.compile else 1)  # type: ignore[attr-defined]


def _hits(
    objective: Any, step_logits: list[torch.Tensor], feats: Features, mask: torch.Tensor
) -> torch.Tensor:
    """Held-out counts of each step's top-1 and top-k drafts matching the target's greedy token."""
    head = objective.head
    tops = [head.draft_to_target(logits.topk(objective.cfg.topk, dim=-1).indices) for logits in step_logits]
    return losses.draft_hits(tops, feats.logits.argmax(-1), mask)


def ttt_train_loss(
    objective: Any, h0: torch.Tensor, feats: Features, batch: dict[str, Any], counts: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The EAGLE-3 training loss: sum_j decay**j * mean over step j's scored positions of
    loss.kl_weight * soft CE + loss.tv_weight * TV against the target's draft-vocabulary
    distribution. cost: the draft lm_head runs only where a step is scored, every step's rows
    in one fused chunked pass (fused.py), and the target's labels are projected
    once, at the positions they are needed; no host sync with the batch's plan (batch["plan"]).
    Packed rows (batch["docs"], batch["positions"]) keep each conversation to itself."""
    head, cfg = objective.head, objective.cfg.loss
    ids, mask, plan = batch["input_ids"], batch["loss_mask"], batch.get("plan")
    if plan is None:
        plan = ttt_plan(mask, cfg.ttt_steps).to(h0.device)  # cost: one host sync
    run = compiled(unroll_scored, objective.compile_backend) if objective.cfg.compile else unroll_scored
    outs, _, _ = run(head, h0, ids, mask, cfg.ttt_steps, plan, batch.get("docs"), batch.get("positions"))
    chosen = torch.cat([g.flatten(0, 1) for g in outs]).index_select(0, plan.select)  # (M, H)
    labels = feats.last_hidden.flatten(0, 1).index_select(0, plan.needed)  # (N, H)
    probs = torch.softmax(objective.target_logits_at(labels, head), -1, dtype=torch.float32)  # (N, Vd)
    if counts is None:  # the local counts, known on the host
        counts = torch.tensor(plan.per_step, dtype=torch.float32, device=h0.device)
    counts = counts.clamp(min=1.0)
    decay = cfg.ttt_decay ** torch.arange(cfg.ttt_steps, device=h0.device, dtype=torch.float32)
    weights = (decay / counts).index_select(0, plan.step_of)  # (M,)
    loss, per_row = fused_ttt_loss(head.norm(chosen), head.lm_head.weight, probs, plan.rows, weights,
                                   cfg.kl_weight, cfg.tv_weight)  # fmt: skip
    per_step = torch.zeros(cfg.ttt_steps, device=h0.device).index_add_(0, plan.step_of, per_row) / counts
    return loss, per_step

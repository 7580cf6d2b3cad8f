"""The trainable module handed to `accelerator.prepare`: target features in, loss (and held-out
hit counts) out. Computing the loss inside `forward` lets DDP/FSDP/DeepSpeed see every trainable
parameter (the head, plus LoRA adapters for Medusa-2); the frozen target is NOT a submodule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart import kinds
from headstart.targets.features import Features, capture
from headstart.train.compiled import compiled_features
from headstart.train.config import TrainConfig
from headstart.train.losses import ahead
from headstart.train.plan import TTTPlan, ttt_plan


def ttt_mask(steps_before: int, length: int, batch: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Attention of unroll step j = steps_before over the cached keys of steps 0..j, (B, 1, T, (j+1)T).

    Query t at step j stands for draft position t+j: it sees the true prefix (step 0 keys at
    positions <= t) and its own draft ancestors (steps 1..j at the same t), as in inference."""
    eye = torch.eye(length, dtype=torch.bool, device=device)
    blocks = [torch.ones(length, length, dtype=torch.bool, device=device).tril()] + [eye] * steps_before
    visible = torch.cat(blocks, dim=-1)  # (T, (j+1)T)
    return additive(visible, dtype).expand(batch, 1, *visible.shape)


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility mask as the additive one attention takes: 0 where seen, min elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, torch.finfo(dtype).min
    )


def unroll(head: Any, h0: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Run an EAGLE head `steps` times on its own outputs; g_j (B, T, H) per step.
    Step j reads token x_{t+1+j} at position t+j and the previous step's g (step 0: h0)."""
    batch, length, _ = h0.shape
    cache = head.new_cache()
    base = torch.arange(length, device=h0.device).expand(batch, length)
    outs, hidden = [], h0
    for j in range(steps):
        mask = ttt_mask(j, length, batch, h0.dtype, h0.device)
        hidden = head(
            hidden,
            ahead(input_ids, 1 + j),
            position_ids=base + j,
            attention_mask=mask,
            past_key_values=cache,
        )
        outs.append(hidden)
    return outs


def unroll_scored(
    head: Any, h0: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, steps: int,
    plan: TTTPlan | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """`unroll` for training, run only where a loss reads it (`TTTPlan.order`).

    Returns per step j: g_j (B, S_j, H), its positions (B, S_j) and which of them are real (B, S_j)
    rather than filler. Step 0 runs whole at the positions some step scores; everywhere else it
    only caches keys and values. Steps 1.. run at the positions a later step scores. A query at t
    sees the step-0 keys at positions <= t and its own draft ancestors, as in `unroll`, so g_j at a
    real position equals unroll's (tests/train/test_train_unroll.py).
    `plan`: the batch's host-side plan (headstart.train.plan, made by the collate); without one
    it is made here. cost: the draft layer's MLP and attention output run on the reply positions
    only (about half the tokens of a chat batch); step j's mask is S x (T + jS), not T x (j+1)T.
    No host sync with a plan (one without)."""
    batch = h0.shape[0]
    if plan is None:
        plan = ttt_plan(loss_mask, steps).to(h0.device)  # cost: one host sync (the mask's copy)
    order, first, later = plan.order, plan.first, plan.later
    cache = head.new_cache()
    rest = order[:, first:]  # step 0 keys and values only
    if rest.shape[1]:
        head(
            h0.gather(1, rest[..., None].expand(-1, -1, h0.shape[-1])),
            ahead(input_ids, 1).gather(1, rest),
            position_ids=rest,
            attention_mask=additive(rest[:, None, :] <= rest[:, :, None], h0.dtype)[:, None],
            past_key_values=cache,
            keys_only=True,
        )
    keys = torch.cat([rest, order[:, :first]], dim=1)  # (B, T): positions of the cached step-0 keys
    positions = [order[:, :first]] + [order[:, :later]] * (steps - 1)
    outs = []
    for j, at in enumerate(positions):
        width = at.shape[1]
        eye = torch.eye(width, dtype=torch.bool, device=h0.device).expand(batch, width, width)
        causal = keys[:, None, :] <= at[:, :, None]  # (B, S, T): the true prefix each query sees
        # steps >= 1 read the previous step's first S_1 outputs, copied (index_select): a view would
        # be contiguous only when S_1 = S_0, a shape relation a compiled step would guard on
        hidden = (
            h0.gather(1, at[..., None].expand(-1, -1, h0.shape[-1]))
            if j == 0
            else outs[-1].index_select(1, torch.arange(width, device=h0.device))
        )
        outs.append(
            head(
                hidden,
                ahead(input_ids, 1 + j).gather(1, at),
                position_ids=at + j,
                attention_mask=additive(torch.cat([causal] + [eye] * j, dim=-1), h0.dtype)[:, None],
                past_key_values=cache,
            )
        )
    valid = [torch.arange(a.shape[1], device=h0.device)[None] < c[:, None] for a, c in
             zip(positions, [plan.first_counts] + [plan.later_counts] * (steps - 1), strict=True)]  # fmt: skip
    return outs, positions, valid


def shared_counts(mask: torch.Tensor, shifts: list[int]) -> torch.Tensor | None:
    """Per-term token counts averaged over processes, or None in a single process.

    DDP averages the processes' gradients; dividing each process's token sum by the mean count
    (instead of its own count) makes that average the gradient of the global token mean, so the
    result does not depend on how conversations of different lengths fall on processes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    counts = torch.stack([ahead(mask, s).sum() for s in shifts]).to(torch.float32)
    dist.all_reduce(counts)  # cost: one small collective per micro-batch
    return counts / dist.get_world_size()


class Objective(nn.Module):
    """head (+ LoRA target) -> losses. forward returns {"loss", "parts"} or, with evaluate, "hits"."""

    def __init__(
        self, head: nn.Module, target_model: Any, cfg: TrainConfig, trainable_target: bool = False,
        compile_backend: str = "inductor",
    ) -> None:  # fmt: skip
        super().__init__()
        self.head = head
        self.cfg = cfg
        self.compile_backend = compile_backend  # with cfg.compile (tests pass aot_eager: no codegen)
        if trainable_target:
            self.target = target_model  # Medusa-2: the peft-wrapped target, its LoRA weights train
        else:
            self._frozen = [target_model]  # a list hides it from nn.Module: never saved, never wrapped
        self._rows: dict[str, Any] = {}  # the target lm_head's draft-vocabulary rows (EAGLE-3)

    @property
    def target_model(self) -> Any:
        return self.target if "target" in self._modules else self._frozen[0]

    def features(self, batch: dict[str, Any], grad: bool, full_logits: bool) -> Features:
        """The target's features for the batch. Without `full_logits` the target's V x H lm_head
        is NOT run at every position (logits are None): the losses project only the positions
        they score (`target_logits_at`); prompt tokens are most of a batch and score nothing."""
        layers = self.head.feature_layers
        if "features" not in batch and self.cfg.compile and not (grad or full_logits):
            return compiled_features(self.target_model, batch["input_ids"], layers, self.compile_backend)
        if "features" not in batch:
            return capture(self.target_model, batch["input_ids"], layers=layers, grad=grad,
                           logits_to_keep=0 if full_logits else 1)  # fmt: skip
        cached = batch["features"]  # offline: distill's cache, (B, T, H) each
        dtype = next(self.head.parameters()).dtype
        last = cached["last"].to(dtype)
        logits = None
        if full_logits:
            with torch.no_grad():  # cost: the lm_head (V x H) over every position
                logits = self.target_model.get_output_embeddings()(last)
        return Features(
            logits=logits, last_hidden=last, layers={i: cached[f"layer{i}"].to(dtype) for i in layers}
        )

    @torch.no_grad()
    def target_logits_at(self, hidden: torch.Tensor, head: Any) -> torch.Tensor:
        """The frozen target's logits for hidden states (..., H) over the head's draft vocabulary
        (`head.draft_ids()`, (Vd,)) only."""
        lm_head = self.target_model.get_output_embeddings()
        key = (head.draft_ids_key(), lm_head.weight.device)  # host-side: no sync per step
        if self._rows.get("key") != key:
            vocab_ids = head.draft_ids().to(lm_head.weight.device)
            self._rows = {  # cost: one (Vd x H) gather, then reused every batch
                "key": key,
                "weight": lm_head.weight[vocab_ids],
                "bias": None if getattr(lm_head, "bias", None) is None else lm_head.bias[vocab_ids],
            }
        return torch.nn.functional.linear(hidden, self._rows["weight"], self._rows["bias"])

    @property
    def trains_target(self) -> bool:
        """Medusa-2: the target trains through its LoRA adapters (and its own loss is logged)."""
        return "target" in self._modules

    def forward(
        self, batch: dict[str, Any], evaluate: bool = False, joint: bool = False
    ) -> dict[str, torch.Tensor]:
        """The head kind's loss (headstart.kinds: its `objective`) over the batch's features."""
        loss = kinds.load(kinds.get(self.head.kind).objective)
        full = evaluate or getattr(loss, "full_logits", False) or self.trains_target
        feats = self.features(batch, grad=joint and not evaluate, full_logits=full)
        return loss(self, feats, batch, evaluate, joint)

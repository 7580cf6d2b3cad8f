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
        if "features" not in batch and "docs" in batch:
            # packed rows: transformers reads where each conversation starts from positions that
            # restart at 0 (masking_utils.find_packed_sequence_indices) and keeps each to itself:
            # a block-causal mask under SDPA (cost: attention over the whole row, T x T, where
            # one conversation a row attends over its own length), varlen kernels under flash attention
            return capture(self.target_model, batch["input_ids"], layers=layers, grad=grad,
                           position_ids=batch["positions"], logits_to_keep=0 if full_logits else 1)  # fmt: skip
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

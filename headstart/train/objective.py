"""The trainable module handed to `accelerator.prepare`: target features in, loss (and held-out
hit counts) out. Computing the loss inside `forward` lets DDP/FSDP/DeepSpeed see every trainable
parameter (the head, plus LoRA adapters for Medusa-2); the frozen target is NOT a submodule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart.target.features import Features, capture
from headstart.train import losses
from headstart.train.config import TrainConfig
from headstart.train.losses import ahead


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


def later_positions(loss_mask: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The query positions unroll steps 1.. must run at: those some step j >= 1 scores
    (x_{t+2+j} a reply token). Returns (B, S) positions, the needed ones first in order, then
    filler, and (B, S) which are needed. Prompts are most of a batch and no later step scores
    them, while step 0 runs everywhere: its keys are every later query's context."""
    later = torch.zeros(loss_mask.shape, dtype=torch.bool, device=loss_mask.device)
    for j in range(1, steps):
        later |= ahead(loss_mask, 2 + j).bool()
    count = later.sum(1)
    width = max(int(count.max()), 1)  # cost: one host sync per batch
    order = torch.argsort((~later).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=order.device)[None] < count[:, None]
    return order, valid


def unroll_scored(
    head: Any, h0: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, steps: int
) -> tuple[list[torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
    """`unroll` for training: step 0 at every position, steps 1.. only at `later_positions`.

    Returns g_0 (B, T, H), then g_j (B, S, H) at `order` (B, S), and `valid` (B, S). A query at t
    sees the step-0 keys at positions <= t and its own draft ancestors, as in `unroll`, so g_j
    at order[b, i] equals unroll's g_j at that position (tests/train/test_train_unroll.py).
    cost: the draft layer and its attention run on the reply positions only in steps 1.. (about
    half the tokens of a chat batch), and each step's mask is S x (T + jS), not T x (j+1)T."""
    batch, length, _ = h0.shape
    cache = head.new_cache()
    base = torch.arange(length, device=h0.device).expand(batch, length)
    first = head(
        h0,
        ahead(input_ids, 1),
        position_ids=base,
        attention_mask=ttt_mask(0, length, batch, h0.dtype, h0.device),
        past_key_values=cache,
    )
    if steps == 1:
        return [first], None, None
    order, valid = later_positions(loss_mask, steps)
    width = order.shape[1]
    causal = base[:, None, :] <= order[:, :, None]  # (B, S, T): the true prefix each query sees
    eye = torch.eye(width, dtype=torch.bool, device=h0.device).expand(batch, width, width)
    outs = [first]
    hidden = first.gather(1, order[..., None].expand(-1, -1, first.shape[-1]))
    for j in range(1, steps):
        visible = torch.cat([causal] + [eye] * j, dim=-1)  # (B, S, T + jS)
        hidden = head(
            hidden,
            ahead(input_ids, 1 + j).gather(1, order),
            position_ids=order + j,
            attention_mask=additive(visible, h0.dtype)[:, None],
            past_key_values=cache,
        )
        outs.append(hidden)
    return outs, order, valid


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
        self, head: nn.Module, target_model: Any, cfg: TrainConfig, trainable_target: bool = False
    ) -> None:
        super().__init__()
        self.head = head
        self.cfg = cfg
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
    def target_logits_at(self, hidden: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
        """The frozen target's logits for hidden states (..., H) over `vocab_ids` (Vd,) only."""
        lm_head = self.target_model.get_output_embeddings()
        known = self._rows.get("ids")
        if known is None or known.shape != vocab_ids.shape or not torch.equal(known, vocab_ids):
            self._rows = {  # cost: one (Vd x H) gather, then reused every batch
                "ids": vocab_ids,
                "weight": lm_head.weight[vocab_ids],
                "bias": None if getattr(lm_head, "bias", None) is None else lm_head.bias[vocab_ids],
            }
        return torch.nn.functional.linear(hidden, self._rows["weight"], self._rows["bias"])

    def forward(
        self, batch: dict[str, Any], evaluate: bool = False, joint: bool = False
    ) -> dict[str, torch.Tensor]:
        kind = self.head.kind
        full = evaluate or kind == "eagle" or "target" in self._modules
        feats = self.features(batch, grad=joint and not evaluate, full_logits=full)
        ids, mask = batch["input_ids"], batch["loss_mask"]
        if kind == "medusa":
            return self._medusa(feats, ids, mask, evaluate, joint)
        return self._eagle(feats, ids, mask, evaluate)

    def _medusa(
        self, feats: Features, ids: torch.Tensor, mask: torch.Tensor, evaluate: bool, joint: bool
    ) -> dict[str, torch.Tensor]:
        heads = self.head.num_heads
        counts = shared_counts(mask, [2 + i for i in range(heads)] + [1])  # heads, then LM
        head_counts, lm_count = (None, None) if counts is None else (counts[:-1], counts[-1])
        decay = self.cfg.loss.medusa_decay
        if evaluate:  # every position: the hit counts need each head's top-k everywhere
            logits = self.head(feats.last_hidden)  # (K, B, T, V)
            loss, per_head = losses.medusa_loss(logits, ids, mask, decay, head_counts)
        else:  # cost: each head's V x H projection runs on the positions it is scored at only
            where = losses.scored(mask, [2 + i for i in range(heads)])
            loss, per_head = losses.medusa_loss_at(
                [self.head.head_logits(i, feats.last_hidden[w]) for i, w in enumerate(where)],
                [ahead(ids, 2 + i)[w] for i, w in enumerate(where)],
                decay,
                head_counts,
            )
        out = {"loss": loss, "parts": per_head}
        if "target" in self._modules:  # Medusa-2: also log the target's own loss during warm-up
            lm = losses.lm_loss(feats.logits, ids, mask, lm_count)
            out["parts"] = torch.cat([per_head, lm.detach()[None]])
            if joint:  # after warm-up the target trains through its LoRA adapters
                out["loss"] = self.cfg.lora.lm_weight * lm + self.cfg.lora.heads_weight * loss
        if evaluate:
            if getattr(self.head, "has_draft_vocab", False):  # score what drafting can propose
                logits = logits.masked_fill(~self.head.t2d, float("-inf"))
            top = logits.topk(self.cfg.topk, dim=-1).indices  # (K, B, T, k), already target ids
            out["hits"] = losses.draft_hits(list(top), feats.logits.argmax(-1), mask)
        return out

    def _eagle(
        self, feats: Features, ids: torch.Tensor, mask: torch.Tensor, evaluate: bool
    ) -> dict[str, torch.Tensor]:
        head, cfg = self.head, self.cfg.loss
        h0 = head.fuse(feats.last_hidden, feats.layers)
        if head.kind == "eagle":
            if not evaluate and cfg.eagle_noise > 0:
                h0 = h0 + (torch.rand_like(h0) - 0.5) * cfg.eagle_noise  # consumes the global RNG
            steps = unroll(head, h0, ids, cfg.eval_steps if evaluate else 1)
            counts = shared_counts(mask, [2])
            loss, feature, ce = losses.eagle1_loss(
                steps[0],
                head.logits(steps[0]),
                feats.last_hidden,
                feats.logits,
                mask,
                cfg.eagle_feature_weight,
                cfg.eagle_ce_weight,
                None if counts is None else counts[0],
            )
            out = {"loss": loss, "parts": torch.stack([feature, ce])}
        else:
            depth = (cfg.eval_ttt_steps or cfg.ttt_steps) if evaluate else cfg.ttt_steps
            counts = shared_counts(mask, [2 + j for j in range(depth)])
            if evaluate:  # every position: the hit counts need each step's top-k everywhere
                steps = unroll(head, h0, ids, depth)
                target_draft = feats.logits[..., head.draft_ids()]  # (B, T, Vd)
                step_logits = [head.logits(g) for g in steps]  # per step (B, T, Vd)
                loss, per_step = losses.ttt_loss(step_logits, target_draft, mask, cfg.ttt_decay, counts)
            else:
                loss, per_step = self._ttt_train_loss(h0, feats, ids, mask, counts)
            out = {"loss": loss, "parts": per_step}
        if evaluate:
            if head.kind == "eagle":
                step_logits = [head.logits(g) for g in steps]
            tops = [
                head.draft_to_target(logits.topk(self.cfg.topk, dim=-1).indices) for logits in step_logits
            ]
            out["hits"] = losses.draft_hits(tops, feats.logits.argmax(-1), mask)
        return out

    def _ttt_train_loss(
        self, h0: torch.Tensor, feats: Features, ids: torch.Tensor, mask: torch.Tensor, counts: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The EAGLE-3 training loss. cost: the draft lm_head runs only where a step is scored, and
        the target's draft-vocabulary labels are projected once, at the positions they are needed."""
        head, cfg = self.head, self.cfg.loss
        outs, order, valid = unroll_scored(head, h0, ids, mask, cfg.ttt_steps)
        needed = ahead(mask, 1).bool()
        index = losses.soft_label_index(needed)
        probs = self.target_logits_at(feats.last_hidden[needed], head.draft_ids()).float().softmax(-1)
        logits, rows = [], []
        for j, g in enumerate(outs):
            where, row = ahead(mask, 2 + j).bool(), ahead(index, 1 + j)
            if j:  # steps 1.. ran at `order` only
                where, row = where.gather(1, order) & valid, row.gather(1, order)
            logits.append(head.logits(g[where]))
            rows.append(row[where])
        return losses.ttt_loss_at(logits, probs, rows, cfg.ttt_decay, counts)

"""The trainable module handed to `accelerator.prepare`: target features in, loss (and held-out
hit counts) out. Computing the loss inside `forward` lets DDP/FSDP/DeepSpeed see every trainable
parameter (the head, plus LoRA adapters for Medusa-2); the frozen target is NOT a submodule.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart.target.features import Features, capture
from headstart.train import block, losses
from headstart.train.compiled import compiled, compiled_features
from headstart.train.config import TrainConfig
from headstart.train.fused import fused_ttt_loss
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
        if kind == "dflash":
            return self._dflash(feats, batch, evaluate)
        return self._eagle(feats, ids, mask, evaluate, batch.get("ttt"))

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
        self, feats: Features, ids: torch.Tensor, mask: torch.Tensor, evaluate: bool, batch_plan: Any = None
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
                loss, per_step = self._ttt_train_loss(h0, feats, ids, mask, counts, batch_plan)
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
        self, h0: torch.Tensor, feats: Features, ids: torch.Tensor, mask: torch.Tensor, counts: Any,
        plan: TTTPlan | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The EAGLE-3 training loss: sum_j decay**j * mean over step j's scored positions of
        loss.kl_weight * soft CE + loss.tv_weight * TV against the target's draft-vocabulary
        distribution. cost: the draft lm_head runs only where a step is scored, every step's rows
        in one fused chunked pass (headstart.train.fused), and the target's labels are projected
        once, at the positions they are needed; no host sync with the batch's plan."""
        head, cfg = self.head, self.cfg.loss
        if plan is None:
            plan = ttt_plan(mask, cfg.ttt_steps).to(h0.device)  # cost: one host sync
        run = compiled(unroll_scored, self.compile_backend) if self.cfg.compile else unroll_scored
        outs, _, _ = run(head, h0, ids, mask, cfg.ttt_steps, plan)
        chosen = torch.cat([g.flatten(0, 1) for g in outs]).index_select(0, plan.select)  # (M, H)
        labels = feats.last_hidden.flatten(0, 1).index_select(0, plan.needed)  # (N, H)
        probs = self.target_logits_at(labels, head.draft_ids()).float().softmax(-1)  # (N, Vd)
        if counts is None:  # the local counts, known on the host
            counts = torch.tensor(plan.per_step, dtype=torch.float32, device=h0.device)
        counts = counts.clamp(min=1.0)
        decay = cfg.ttt_decay ** torch.arange(cfg.ttt_steps, device=h0.device, dtype=torch.float32)
        weights = (decay / counts).index_select(0, plan.step_of)  # (M,)
        loss, per_row = fused_ttt_loss(head.norm(chosen), head.lm_head.weight, probs, plan.rows, weights,
                                       cfg.kl_weight, cfg.tv_weight)  # fmt: skip
        per_step = torch.zeros(cfg.ttt_steps, device=h0.device).index_add_(0, plan.step_of, per_row) / counts
        return loss, per_step

    def _dflash(self, feats: Features, batch: dict[str, Any], evaluate: bool) -> dict[str, torch.Tensor]:
        """DFlash: blocks at sampled anchors (every candidate when evaluating, in chunks), each
        slot's loss weighted by its depth (headstart.train.block)."""
        head, cfg = self.head, self.cfg.loss
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
        probs = (self.target_logits_at(feats.last_hidden[needed], head.draft_ids()).float().softmax(-1)
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
            per_slot.append(self._slot_loss(logits, where, hit, ids, index, probs, soft))
            scored.append(hit)
            if evaluate:
                top = torch.full((*hit.shape, self.cfg.topk), -1, dtype=torch.long, device=hit.device)
                top[hit] = head.draft_to_target(logits.topk(self.cfg.topk, dim=-1).indices)
                tops.append((top[:, :, :depth], where[:, :, :depth], hit[:, :, :depth]))
        total = torch.cat(scored, dim=1)
        loss, parts = block.weighted_block_loss(
            torch.cat(per_slot, dim=1), total, weights, block.shared_total((weights * total).sum())
        )
        out = {"loss": loss, "parts": parts}
        if evaluate:
            out["hits"] = block_hits(tops, feats.logits.argmax(-1), depth)
        return out

    def _slot_loss(self, logits: torch.Tensor, where: torch.Tensor, hit: torch.Tensor, ids: torch.Tensor,
                   index: torch.Tensor, probs: torch.Tensor | None, soft: bool) -> torch.Tensor:  # fmt: skip
        """Each slot's loss (B, N, S-1), 0 where not scored; `logits` (M, Vd) are the scored
        slots'. Soft: CE against the target's distribution at a+k-1 (its row of `probs`); hard:
        CE against the token x_{a+k}, 0 when that token is outside the draft vocabulary."""
        head = self.head
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
    """Held-out counts (B, depth, 3) of [top-1 hits, top-k hits, predictions], depth j = slot j+1,
    against the target's greedy token there (`losses.draft_hits`' layout: step j of EAGLE-3)."""
    rows = []
    for j in range(depth):
        hit1 = hitk = count = 0
        for top, where, scored in tops:
            want = target_argmax.gather(1, (where[:, :, j] - 1).clamp_min(0))  # (B, N): z at a+j
            ok = scored[:, :, j]
            hit1 = hit1 + ((top[:, :, j, 0] == want) & ok).sum(1)
            hitk = hitk + ((top[:, :, j] == want[..., None]).any(-1) & ok).sum(1)
            count = count + ok.sum(1)
        rows.append(torch.stack([hit1, hitk, count], dim=-1))  # (B, 3)
    return torch.stack(rows, dim=1).to(torch.float64)

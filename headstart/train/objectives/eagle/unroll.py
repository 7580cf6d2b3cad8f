"""EAGLE's training-time unroll: the head run on its own outputs for several steps, each step's
query at t standing for draft position t + j (it sees the true prefix and its own draft
ancestors, as in inference); `unroll_scored` runs only where a loss reads it (plan.py)."""

from __future__ import annotations

from typing import Any

import torch

from headstart.train.losses import ahead
from headstart.train.objectives.eagle.plan import TTTPlan, ttt_plan


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
    plan: TTTPlan | None = None, docs: torch.Tensor | None = None, positions: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """`unroll` for training, run only where a loss reads it (`TTTPlan.order`).

    Returns per step j: g_j (B, S_j, H), its positions (B, S_j) and which of them are real (B, S_j)
    rather than filler. Step 0 runs whole at the positions some step scores; everywhere else it
    only caches keys and values. Steps 1.. run at the positions a later step scores. A query at t
    sees the step-0 keys at positions <= t and its own draft ancestors, as in `unroll`, so g_j at a
    real position equals unroll's (tests/train/test_train_unroll.py).
    `plan`: the batch's host-side plan (plan.py, made by the collate); without one
    it is made here. cost: the draft layer's MLP and attention output run on the reply positions
    only (about half the tokens of a chat batch); step j's mask is S x (T + jS), not T x (j+1)T.
    No host sync with a plan (one without).
    `docs`, `positions` (B, T): packed rows (train/data.py `Packed`): a query sees the keys of its
    own conversation only, at that conversation's positions; a packed row of one conversation
    gives unroll_scored's outputs without them (tests/train/test_train_pack.py)."""
    batch = h0.shape[0]
    if plan is None:
        plan = ttt_plan(loss_mask, steps).to(h0.device)  # cost: one host sync (the mask's copy)
    order, first, later = plan.order, plan.first, plan.later
    cache = head.new_cache()
    doc_of = (lambda at: at) if docs is None else (lambda at: docs.gather(1, at))
    position_of = (lambda at: at) if positions is None else (lambda at: positions.gather(1, at))

    def seen(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """(B, S, K): the true prefix each query sees (its own conversation's, when packed)."""
        visible = keys[:, None, :] <= queries[:, :, None]
        return (
            visible if docs is None else visible & (doc_of(keys)[:, None, :] == doc_of(queries)[:, :, None])
        )

    rest = order[:, first:]  # step 0 keys and values only
    if rest.shape[1]:
        head(
            h0.gather(1, rest[..., None].expand(-1, -1, h0.shape[-1])),
            ahead(input_ids, 1).gather(1, rest),
            position_ids=position_of(rest),
            attention_mask=additive(seen(rest, rest), h0.dtype)[:, None],
            past_key_values=cache,
            keys_only=True,
        )
    keys = torch.cat([rest, order[:, :first]], dim=1)  # (B, T): positions of the cached step-0 keys
    queries = [order[:, :first]] + [order[:, :later]] * (steps - 1)  # each step's positions
    outs = []
    for j, at in enumerate(queries):
        width = at.shape[1]
        eye = torch.eye(width, dtype=torch.bool, device=h0.device).expand(batch, width, width)
        causal = seen(at, keys)  # (B, S, T)
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
                position_ids=position_of(at) + j,
                attention_mask=additive(torch.cat([causal] + [eye] * j, dim=-1), h0.dtype)[:, None],
                past_key_values=cache,
            )
        )
    valid = [torch.arange(a.shape[1], device=h0.device)[None] < c[:, None] for a, c in
             zip(queries, [plan.first_counts] + [plan.later_counts] * (steps - 1), strict=True)]  # fmt: skip
    return outs, queries, valid

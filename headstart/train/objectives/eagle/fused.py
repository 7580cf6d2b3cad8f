"""The draft-vocabulary loss of every TTT step in one fused, chunked pass.

For M scored rows (all steps together) with normed draft states h (M, H), the draft lm_head's
weight W (Vd, H) and the target's draft-vocabulary distributions p (N, Vd) (row r learns
p[rows[r]]), the loss is sum_r w_r * (kl * CE(p, q_r) + tv * TV(p, q_r)), q_r = softmax(h_r W^T).
The unfused path (a logits matrix per step, `log_softmax`, a gathered copy of p per step, and
autograd keeping each for the backward) moved several (M, Vd) float matrices through memory per
step and launched a dozen kernels per step; here rows go through in chunks of `chunk`, the
gradients of h and W are computed in the forward pass while the chunk's logits are at hand
(nothing (M, Vd) is kept), and the backward only scales them. The same maths as
`loss_terms.ttt_loss_at` over `head.logits` (tests/train/test_train_fused.py).
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK_ELEMENTS = {"cpu": 1 << 21, "cuda": 1 << 25}
"""Rows per chunk: as many as make a (rows, Vd) float32 matrix of 8 MB on a CPU (measured: 256
rows of 8,192 ran 1.6x faster than 1,024 on the 2-core Xeon, 2026-11-27) and 128 MB on a GPU
(fewer, larger kernels)."""


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The matmul dtype: the autocast dtype where autocast is on (bf16 under mixed_precision=bf16)."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class _FusedDraftLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
                row_weights: torch.Tensor, kl: float, tv: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        dtype = _compute_dtype(hidden.device, hidden.dtype)
        acc = torch.promote_types(dtype, torch.float32)  # softmax and sums: fp32 at least
        want_weight = ctx.needs_input_grad[1]  # a frozen lm_head (optim.freeze) skips its matmul
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            grad_hidden = torch.empty(hidden.shape, dtype=acc, device=hidden.device)
            grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            per_row = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
            # the row weights (decay^j / rows, ~1e-4) scaled to a largest of 1 for the matmuls and
            # applied back in fp32 after: in fp16, w_r (q - p) would underflow before the loss scale
            # of the backward could save it (bf16 has the range; the same maths either way)
            weights = row_weights.to(acc)
            scale = weights.abs().amax() if weights.numel() else weights.new_ones(())
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # no host sync
            unit = weights / scale
            for start in range(0, hidden.shape[0], chunk):
                end = start + chunk
                h = hidden[start:end].to(dtype)  # (C, H)
                logits = (h @ w.t()).to(acc)  # (C, Vd)
                p = probs.index_select(0, rows[start:end]).to(acc)  # (C, Vd)
                mass = p.sum(-1, keepdim=True)  # 1 up to rounding: the labels are distributions
                lse = logits.logsumexp(-1, keepdim=True)
                # in place from here: every (C, Vd) pass is memory-bound on a CPU
                loss = kl * (lse[:, 0] * mass[:, 0] - torch.linalg.vecdot(p, logits))  # -sum p log q
                q = logits.sub_(lse).exp_()  # (C, Vd), the logits' storage
                if tv:  # 0.5 sum |q - p|; its gradient 0.5 q (s - sum(s q)), s = sign(q - p)
                    sign = q - p
                    loss = loss + tv * 0.5 * sign.abs().sum(-1)
                    sign.sign_()
                    tv_grad = sign.sub_(torch.linalg.vecdot(sign, q)[:, None]).mul_(q).mul_(0.5 * tv)
                grad = q.mul_(kl * mass).sub_(p, alpha=kl)  # d(soft CE)/d logits = q sum(p) - p
                if tv:
                    grad += tv_grad
                per_row[start:end] = loss
                grad = grad.mul_(unit[start:end, None]).to(dtype)
                grad_hidden[start:end] = grad @ w  # (C, H)
                if want_weight:
                    grad_weight += (grad.t() @ h).to(acc)  # (Vd, H)
            grad_hidden.mul_(scale)
            grad_weight.mul_(scale)
            total = (per_row * weights).sum()
        ctx.save_for_backward(grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(per_row)
        return total, per_row

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, _grad_rows: Any) -> tuple[Any, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None, None, None, None, None


def fused_ttt_loss(hidden: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
                   row_weights: torch.Tensor, kl: float = 1.0, tv: float = 0.0,
                   chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(sum_r row_weights[r] * loss_r, loss_r per row (M,), not differentiable); see the module doc.
    hidden (M, H) normed draft states, weight (Vd, H), probs (N, Vd) the target's draft-vocabulary
    distributions, rows (M,) into probs, row_weights (M,). `chunk`: rows per pass (0: CHUNK_ELEMENTS)."""
    elements = CHUNK_ELEMENTS.get(hidden.device.type, CHUNK_ELEMENTS["cuda"])
    chunk = chunk or max(1, elements // max(1, weight.shape[0]))
    return _FusedDraftLoss.apply(hidden, weight, probs, rows, row_weights, float(kl), float(tv), chunk)

"""The fused draft-vocabulary loss equals the unfused one (per-step logits, soft CE, autograd):
loss, per-row losses and the gradients of the states and the lm_head, in chunks or not; the
total-variation term equals its autograd reference."""

from __future__ import annotations

import pytest
import torch

from headstart.train.objectives.eagle.fused import fused_ttt_loss


def _inputs(seed: int = 0, rows: int = 11, hidden: int = 8, vocab: int = 13, labels: int = 5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64) * 0.5
    probs = torch.randn(labels, vocab, generator=g, dtype=torch.float64).mul(2).softmax(-1)
    index = torch.randint(0, labels, (rows,), generator=g)
    weights = torch.rand(rows, generator=g, dtype=torch.float64)
    return h, w, probs, index, weights


def _reference(h, w, probs, index, weights, kl, tv):
    """The unfused maths by autograd: logits, log_softmax, the gathered labels."""
    logits = h @ w.t()
    p = probs[index]
    log_q = logits.log_softmax(-1)
    per_row = kl * -(p * log_q).sum(-1) + tv * 0.5 * (log_q.exp() - p).abs().sum(-1)
    return (per_row * weights).sum(), per_row


@pytest.mark.parametrize("kl,tv", [(1.0, 0.0), (0.0, 1.0), (1.0, 0.5)])
@pytest.mark.parametrize("chunk", [0, 3])
def test_fused_loss_and_gradients_equal_autograd(kl, tv, chunk):
    h, w, probs, index, weights = _inputs()
    grads = []
    for fused in (True, False):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if fused:
            total, per_row = fused_ttt_loss(hh, ww, probs, index, weights, kl, tv, chunk=chunk)
        else:
            total, per_row = _reference(hh, ww, probs, index, weights, kl, tv)
        (2.5 * total).backward()  # a scale on the way back reaches both gradients
        grads.append((total.detach(), per_row.detach(), hh.grad, ww.grad))
    for got, want in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-6, atol=1e-9)


def test_a_frozen_lm_head_gets_no_gradient_and_the_states_the_same():
    h, w, probs, index, weights = _inputs(seed=1)
    hh = h.clone().requires_grad_(True)
    fused_ttt_loss(hh, w, probs, index, weights)[0].backward()
    ref = h.clone().requires_grad_(True)
    _reference(ref, w, probs, index, weights, 1.0, 0.0)[0].backward()
    torch.testing.assert_close(hh.grad, ref.grad)


def test_no_scored_rows_give_a_zero_loss_and_zero_gradients():
    h, w, probs, index, weights = _inputs(rows=0)
    ww = w.clone().requires_grad_(True)
    total, per_row = fused_ttt_loss(h.requires_grad_(True), ww, probs, index, weights)
    total.backward()
    assert total.item() == 0.0 and per_row.shape == (0,) and not ww.grad.any()


def test_under_autocast_the_matmuls_run_in_bf16_and_the_gradients_keep_their_dtypes():
    h, w, probs, index, weights = (x.float() if x.is_floating_point() else x for x in _inputs(seed=2))
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, _ = fused_ttt_loss(hh, ww, probs, index, weights)
    total.backward()
    ref_h, ref_w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    want, _ = _reference(ref_h, ref_w, probs, index, weights, 1.0, 0.0)
    want.backward()
    assert hh.grad.dtype == ww.grad.dtype == torch.float32
    # bf16 matmuls: within bf16's rounding of the fp32 result, not equal to it
    torch.testing.assert_close(total, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(hh.grad, ref_h.grad, rtol=5e-2, atol=5e-2)
    assert not torch.equal(hh.grad, ref_h.grad)


def test_under_fp16_autocast_tiny_row_weights_keep_their_gradients():
    """Row weights are decay^j / rows (~1e-5 on a real batch): weighted before an fp16 cast, the
    per-logit gradients underflowed and most lm_head gradient entries were exactly 0."""
    h, w, probs, index, _ = (
        x.float() if x.is_floating_point() else x for x in _inputs(seed=3, rows=64, vocab=512)
    )
    weights = torch.full((64,), 0.26 / 16000)
    hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        total, _ = fused_ttt_loss(hh, ww, probs, index, weights)
    (65536 * total).backward()  # fp16 training's loss scale
    ref_h, ref_w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (65536 * _reference(ref_h, ref_w, probs, index, weights, 1.0, 0.0)[0]).backward()
    assert (ww.grad == 0).sum() <= (ref_w.grad == 0).sum()
    torch.testing.assert_close(hh.grad, ref_h.grad, rtol=2e-2, atol=1e-3 * ref_h.grad.abs().max().item())
    torch.testing.assert_close(ww.grad, ref_w.grad, rtol=2e-2, atol=1e-3 * ref_w.grad.abs().max().item())

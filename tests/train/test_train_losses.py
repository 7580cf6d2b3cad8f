"""The pure losses: alignment (which position predicts which token), masking, weights (the shared
ones in train/losses.py, Medusa's per-head CE and EAGLE's in their kinds' objective modules)."""

from __future__ import annotations

import math

import torch

from headstart.train import losses
from headstart.train.objectives.eagle import loss_terms as eagle_losses
from headstart.train.objectives.medusa import per_head_ce


def _onehot_logits(tokens: torch.Tensor, vocab: int, scale: float = 30.0) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, vocab).float() * scale


def test_ahead_shifts_left_and_zero_pads():
    x = torch.arange(6).view(1, 6)
    assert losses.ahead(x, 2).tolist() == [[2, 3, 4, 5, 0, 0]]
    assert losses.ahead(x, 0).tolist() == x.tolist()
    assert losses.ahead(x, 9).tolist() == [[0] * 6]


def test_medusa_head_i_is_scored_on_token_t_plus_2_plus_i():
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    right = torch.stack([_onehot_logits(losses.ahead(ids, 2 + i), 11) for i in range(3)])
    wrong = torch.stack([_onehot_logits(losses.ahead(ids, 1 + i), 11) for i in range(3)])
    loss, per_head = per_head_ce(right, ids, mask, decay=0.8)
    assert per_head.shape == (3,) and loss < 1e-6
    bad, _ = per_head_ce(wrong, ids, mask, decay=0.8)
    assert bad > 5.0
    # decay weighs head i by decay**i
    uniform = torch.zeros(3, 2, 9, 11)
    loss, per_head = per_head_ce(uniform, ids, mask, decay=0.5)
    assert math.isclose(loss.item(), math.log(11) * (1 + 0.5 + 0.25), rel_tol=1e-5)


def test_loss_mask_selects_predicted_reply_tokens_only():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 0, 0, 1, 1]])  # only x_4, x_5 are reply tokens
    logits = torch.zeros(1, 1, 6, 8)
    logits[0, 0, 2, 5] = 50.0  # position 2 predicts x_4 = 5 right; everything else uniform
    logits[0, 0, 3, 6] = 50.0  # position 3 predicts x_5 = 6 right
    loss, _ = per_head_ce(logits, ids, mask, decay=1.0)
    assert loss < 1e-6  # uniform positions 0, 1, 4, 5 are masked out


def test_ttt_step_j_matches_target_distribution_at_t_plus_1_plus_j():
    torch.manual_seed(1)
    target = torch.randn(2, 8, 5)
    mask = torch.ones(2, 8, dtype=torch.long)
    aligned = [losses.ahead(target, 1 + j) for j in range(3)]
    loss, per_step = eagle_losses.ttt_loss(aligned, target, mask, decay=0.8)
    valid = torch.stack([losses.ahead(mask, 2 + j) for j in range(3)])
    entropy = -(target.softmax(-1) * target.log_softmax(-1)).sum(-1)
    expected = [losses.masked_mean(losses.ahead(entropy, 1 + j), valid[j]) for j in range(3)]
    torch.testing.assert_close(per_step, torch.stack(expected))  # soft CE with itself = entropy (the minimum)
    shifted = [losses.ahead(target, 2 + j) for j in range(3)]
    worse, _ = eagle_losses.ttt_loss(shifted, target, mask, decay=0.8)
    assert worse > loss


def test_eagle1_feature_target_is_next_position():
    torch.manual_seed(2)
    hidden, logits = torch.randn(1, 7, 4), torch.randn(1, 7, 9)
    mask = torch.ones(1, 7, dtype=torch.long)
    _, feature, ce = eagle_losses.eagle1_loss(
        losses.ahead(hidden, 1), losses.ahead(logits, 1), hidden, logits, mask, 1.0, 0.1
    )
    assert feature.item() < 1e-8
    _, feature_off, _ = eagle_losses.eagle1_loss(hidden, logits, hidden, logits, mask, 1.0, 0.1)
    assert feature_off > 0.05


def test_draft_hits_and_acceptance_length():
    target_argmax = torch.tensor([[7, 1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    # step 0 at t predicts target_argmax[t+1] for mask[t+2]: positions 0..3
    top = torch.tensor([[1, 2, 9, 9, 0, 0]])[..., None].expand(1, 6, 2).clone()
    top[0, 2, 1] = 3  # top-2 hit at position 2
    hits = losses.draft_hits([top], target_argmax, mask)
    assert hits.shape == (1, 1, 1 + len(losses.bucket_names()), 3)  # (B, S, all + buckets, 3)
    assert hits[:, :, 0].tolist() == [[[2.0, 3.0, 4.0]]]
    assert hits[0, 0, 1].tolist() == [2.0, 3.0, 4.0] and hits[0, 0, 2:].sum() == 0  # all in 0-256


def test_hits_by_position_land_in_their_context_bucket():
    """A conversation of 2,100 positions: each prediction counts in the bucket of the position it
    is drafted from (0-256, 256-512, 512-1k, 1k-2k, 2k+), the buckets sum to the total, and the
    evaluation turns them into per-bucket acceptance (the same buckets as bench's)."""
    from headstart.train.metrics import by_position

    t = 2100
    target_argmax = torch.arange(t)[None] % 50
    mask = torch.ones(1, t, dtype=torch.long)
    top = torch.roll(target_argmax, -1, 1)[..., None].clone()  # right everywhere ...
    top[0, 300:400, 0] = 99  # ... except 100 positions in 256-512
    hits = losses.draft_hits([top], target_argmax, mask)[0, 0]  # (1 + K, 3)
    assert losses.bucket_names() == ["0-256", "256-512", "512-1k", "1k-2k", "2k+"]
    assert hits[1:].sum(0).tolist() == hits[0].tolist()
    assert hits[1:, 2].tolist() == [256.0, 256.0, 512.0, 1024.0, t - 2 - 2048.0]
    assert hits[1:, 0].tolist() == [256.0, 156.0, 512.0, 1024.0, t - 2 - 2048.0]
    figures = by_position(hits[None, 1:])
    assert list(figures) == losses.bucket_names()
    assert figures["0-256"]["accept_len_est"] == 2.0 and figures["256-512"]["top1"] == [round(156 / 256, 4)]
    assert losses.acceptance_length([1.0, 1.0]) == 3.0
    assert math.isclose(losses.acceptance_length([0.5, 0.5]), 1.75)

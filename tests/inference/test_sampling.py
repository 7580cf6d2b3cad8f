"""inference/sampling.py's pre-drawn uniforms (what a round program samples from): blocks of
columns are taken in order, shaped, and no more of them than were drawn; the inverse-CDF draw
never picks a token of probability 0 and picks each with its probability."""

from __future__ import annotations

import pytest
import torch
from chisq import chisquare_pvalue

from headstart.inference.sampling import PreDrawn, inverse_cdf, sample, uniform


def test_pre_drawn_columns_come_in_order_and_run_out():
    draws = torch.rand(3, 2, generator=torch.Generator().manual_seed(0))
    pre = PreDrawn(draws)
    assert torch.equal(uniform((3,), pre, "cpu"), draws[:, 0])
    assert torch.equal(uniform((3,), pre, "cpu"), draws[:, 1])
    with pytest.raises(ValueError, match="after 2 of"):
        uniform((3,), pre, "cpu")
    with pytest.raises(ValueError, match="asked \\(2,\\)"):
        PreDrawn(draws).take((2,))
    block = PreDrawn(torch.arange(12.0).reshape(2, 6))
    assert block.take((2, 1)).tolist() == [[0.0], [6.0]]
    assert block.take((2, 1, 5)).tolist() == [[[1.0, 2.0, 3.0, 4.0, 5.0]], [[7.0, 8.0, 9.0, 10.0, 11.0]]]


def test_inverse_cdf_skips_zero_probability_tokens_at_the_ends():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(4, -1)
    u = torch.tensor([0.0, 0.4999, 0.5001, 1.0 - 2**-24])
    assert inverse_cdf(probs, u).tolist() == [3, 3, 1, 1]
    unnormalised = torch.tensor([[0.0, 3.0, 1.0]])  # a residual: mass need not sum to one
    assert inverse_cdf(unnormalised, torch.tensor([0.1])).tolist() == [2]


def test_inverse_cdf_draws_each_token_with_its_probability():
    probs = torch.tensor([0.0, 0.1, 0.25, 0.0, 0.4, 0.05, 0.2])
    rows = 60_000
    u = torch.rand(rows, generator=torch.Generator().manual_seed(3))
    tokens = sample(probs.expand(rows, -1), PreDrawn(u[:, None]))
    counts = torch.bincount(tokens, minlength=probs.numel())
    assert counts[probs == 0].sum() == 0
    assert chisquare_pvalue(counts, probs) > 1e-3

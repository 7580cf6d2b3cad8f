"""Pearson chi-square goodness of fit without scipy: p = Q(k/2, x/2) (regularised upper gamma)."""

from __future__ import annotations

import torch


def chisquare_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Counts (K,) against probabilities (K,). Cells expected below `min_expected` are pooled into
    one cell (the usual validity rule); zero-probability cells with counts give p = 0."""
    counts, probs = counts.double(), probs.double()
    total = counts.sum()
    if bool(((probs == 0) & (counts > 0)).any()):
        return 0.0
    expected = probs * total
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if obs.numel() < 2:
        return 1.0
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))

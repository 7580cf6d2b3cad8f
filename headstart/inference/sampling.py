"""Logit processing shared by the target and the draft, so both are warped IDENTICALLY.

Exact speculative sampling needs p (target) and q (draft) to be the distributions the user asked
for: temperature, then top-k, then top-p, the order and tie rules of transformers' warpers
(`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`), so plain `generate` and the
speculative decoder sample from the same p.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # plain.py samples through this module: a runtime import would be a circle
    from headstart.inference.plain import SamplingConfig


def warp_logits(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """logits (..., V) -> warped logits (..., V) with -inf on filtered tokens (float32).

    Greedy configs are returned unwarped (only the argmax matters)."""
    scores = logits.float()
    if sampling.greedy:
        return scores
    scores = scores / sampling.temperature
    if sampling.top_k > 0:
        k = min(sampling.top_k, scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # (..., 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - sampling.top_p)
        remove_sorted[..., -1:] = False  # keep at least the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def probabilities(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Warped probabilities (..., V); one-hot at the argmax for greedy configs."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp_logits(logits, sampling).softmax(dim=-1)


class RowGenerators:
    """One torch.Generator per batch row: every random draw is made row by row from the row's own
    generator, so a seeded row's draws do not depend on which rows share its batch (a server's
    requests join and leave). The number of draws a row makes per step is fixed by the tree's
    shape, never by other rows. cost: one small call per row per draw."""

    def __init__(self, generators: list[torch.Generator]) -> None:
        self.generators = list(generators)

    def __len__(self) -> int:
        return len(self.generators)

    def select(self, rows: list[int]) -> RowGenerators:
        return RowGenerators([self.generators[i] for i in rows])

    def merge(self, other: RowGenerators) -> RowGenerators:
        return RowGenerators(self.generators + other.generators)

    def rand(self, shape: tuple[int, ...], device: Any) -> torch.Tensor:
        assert shape[0] == len(self.generators), (shape, len(self.generators))
        return torch.stack([torch.rand(shape[1:], generator=g, device=device) for g in self.generators])

    def multinomial(self, probs: torch.Tensor) -> torch.Tensor:
        """probs (B, ..., V) -> one draw per (row, ...) with the row's generator, (B, ...)."""
        rows = [torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=g).reshape(p.shape[:-1])
                for p, g in zip(probs, self.generators, strict=True)]  # fmt: skip
        return torch.stack(rows)


class PreDrawn:
    """U(0, 1) draws made BEFORE a compiled program from the batch's or its rows' generators (a
    torch.Generator cannot enter a compiled region; inference/captured_round.py) and consumed
    inside it in the order the code asks, each draw a block of the next columns: a static tree's
    Gumbel noise, acceptance's coin flips, then the bonus token by inverse CDF. Which columns
    serve which draw is fixed by the tree's shape, never by the data, so a seeded row's round
    draws the same whatever its batch holds."""

    def __init__(self, draws: torch.Tensor) -> None:
        self.draws = draws  # (B, K)
        self.used = 0  # a trace-time count: the program's draws are static

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The next prod(shape[1:]) columns as `shape` (B, ...)."""
        count = math.prod(shape[1:])
        if shape[0] != self.draws.shape[0] or self.used + count > self.draws.shape[1]:
            raise ValueError(
                f"a round asked {tuple(shape)} draws after {self.used} of {tuple(self.draws.shape)} pre-drawn"
            )
        block = self.draws[:, self.used : self.used + count].reshape(shape)
        self.used += count
        return block


Generator = torch.Generator | RowGenerators | PreDrawn | None


def uniform(shape: tuple[int, ...], generator: Generator, device: Any) -> torch.Tensor:
    """U(0, 1) draws of `shape`, from one generator, per row (RowGenerators) or pre-drawn (the
    next block of a PreDrawn)."""
    if isinstance(generator, RowGenerators):
        return generator.rand(shape, device)
    if isinstance(generator, PreDrawn):
        return generator.take(tuple(shape))
    return torch.rand(shape, generator=generator, device=device)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (B, V) from u (B,) in [0, 1): the first token whose cumulative
    mass reaches (1 - u) * the total, a threshold in (0, total], so a token of probability 0 is
    never chosen and each is chosen with its probability (what FlashInfer's samplers do)."""
    cumulative = probs.cumsum(-1)
    threshold = (1.0 - u)[:, None] * cumulative[:, -1:]
    return (cumulative < threshold).sum(-1).clamp_max(probs.shape[-1] - 1)


def sample(probs: torch.Tensor, generator: Generator = None) -> torch.Tensor:
    """One token per row of probs (..., V) -> (...,) long (a PreDrawn: probs (B, V))."""
    if isinstance(generator, RowGenerators):
        return generator.multinomial(probs)
    if isinstance(generator, PreDrawn):
        return inverse_cdf(probs, generator.take((probs.shape[0],)))
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def order_without_replacement(
    probs: torch.Tensor, count: int, generator: Generator = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` tokens per row drawn WITHOUT replacement from probs (..., V), in draw order.

    Gumbel-top-k: the top-k of log p + Gumbel noise is distributed exactly as k sequential
    draws without replacement. Returns (tokens (..., count), valid (..., count)); a draw is invalid
    once the row's support is exhausted (fewer than `count` tokens with p > 0).
    """
    # out of place: pre-drawn uniforms are a compiled program's input (CUDA graphs skip mutated ones)
    draws = uniform(tuple(probs.shape), generator, probs.device).clamp(1e-20, 1.0)
    keys = probs.log() - (-draws.log()).log()  # log p + Gumbel(0, 1); -inf where p == 0
    values, tokens = torch.topk(keys, count, dim=-1)
    return tokens, values > float("-inf")

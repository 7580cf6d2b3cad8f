"""Acceptance rules: which path of the drafted tree the target agrees with, plus the bonus token.

* `accept_greedy`   exact for greedy decoding: a child is accepted iff it is the target's argmax.
* `accept_sampling` exact for sampling (recursive rejection sampling over the tree): at each node
  try the children in order; accept x with min(1, p(x)/q(x)); on rejection p <- norm(max(p - q, 0))
  and q <- q without x (children drawn without replacement from q), or, for children chosen
  deterministically (q = a point mass on x), accept with p(x) and remove x from p. If every child
  fails, the bonus token is drawn from the residual p. The output is distributed exactly as the
  target's (warped) distribution whatever the draft proposes.
* `accept_typical`  LOSSY (Medusa's typical acceptance): a child is accepted when the target gives
  it more than min(epsilon, alpha * exp(-entropy)). Faster, but NOT the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import Generator, probabilities, sample, uniform, warp_logits
from headstart.inference.trees.draft import DraftTree, path_to


@dataclass
class Acceptance:
    path: torch.Tensor  # (B, A) accepted node ids, root first; short rows repeat their last node.
    # A = the tree's depth bound + 1 (static), so most rows are padded: slice by the host lengths.
    lengths: torch.Tensor  # (B,) path length = 1 + accepted drafts
    bonus: torch.Tensor  # (B,) the token the target emits after the path (the next root)


def _rows(x: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """x (B, n, ...) at node (B,) -> (B, ...)."""
    return x[torch.arange(x.shape[0], device=x.device), node]


def _longest(tree: DraftTree, match: torch.Tensor) -> torch.Tensor:
    """Deepest node whose whole path matches, (B,); match (B, n) with the root True."""
    ok = ~(tree.visible & ~match[:, None, :]).any(-1)  # (B, n): every ancestor-or-self matches
    return torch.where(ok, tree.depths, -1).argmax(-1)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """logits (B, n, V) of the verify forward -> the longest path of argmax tokens."""
    best = logits.argmax(-1)  # (B, n)
    match = (tree.tokens == best.gather(1, tree.parents)) & tree.valid
    match[:, 0] = True
    node = _longest(tree, match)
    path, lengths = path_to(tree.visible, node, tree.depth_bound + 1)
    return Acceptance(path, lengths, best.gather(1, node[:, None])[:, 0])


def accept_typical(
    tree: DraftTree,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    epsilon: float = 0.09,
    alpha: float = 0.3,
    generator: Generator = None,
) -> Acceptance:
    """LOSSY typical acceptance (Medusa): output is NOT distributed as the target's."""
    probs = warp_logits(logits, sampling).softmax(-1)  # (B, n, V)
    entropy = -(probs * probs.clamp_min(1e-20).log()).sum(-1)  # (B, n)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), alpha * torch.exp(-entropy))
    parent_probs = probs.gather(1, tree.parents[..., None].expand_as(probs))  # (B, n, V)
    p_token = parent_probs.gather(2, tree.tokens[..., None])[..., 0]  # (B, n)
    match = (p_token > threshold.gather(1, tree.parents)) & tree.valid
    match[:, 0] = True
    node = _longest(tree, match)
    path, lengths = path_to(tree.visible, node, tree.depth_bound + 1)
    return Acceptance(path, lengths, sample(_rows(probs, node), generator))


def _renormalise(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / total.clamp_min(1e-30), fallback)


def accept_sampling(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: Generator = None
) -> Acceptance:
    """Exact tree rejection sampling (see the module docstring). Loops over depth and sibling
    slots only; every operation is batched over rows."""
    batch, device = logits.shape[0], logits.device
    p_all = probabilities(logits, sampling)  # (B, n, V) warped target distributions
    node = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    residual = p_all[:, 0]
    # The depth bound is the tree's shape (no host sync); levels below the deepest node are
    # no-ops (no live row has children there), they only draw unused uniforms.
    for _ in range(tree.depth_bound):
        kids = _rows(tree.children, node)  # (B, C)
        q = _rows(tree.draft_probs, node) if tree.draft_probs is not None else None  # (B, V)
        moved = torch.zeros_like(alive)
        for slot in range(kids.shape[1]):
            child = kids[:, slot].clamp_min(0)
            tries = alive & ~moved & (kids[:, slot] >= 0) & tree.valid.gather(1, child[:, None])[:, 0]
            token = tree.tokens.gather(1, child[:, None])  # (B, 1)
            p_x = residual.gather(1, token)[:, 0]
            if q is None:
                ratio = p_x  # one-point proposal: accept with p(x)
                point = torch.zeros_like(residual).scatter_(1, token, 1.0)
                rejected_residual = _renormalise((residual - point).clamp_min(0), residual)
            else:
                q_x = q.gather(1, token)[:, 0]
                ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), torch.zeros_like(p_x)).clamp(max=1.0)
                rejected_residual = _renormalise((residual - q).clamp_min(0), residual)
            u = uniform((batch,), generator, device)
            accepted = tries & (u < ratio)
            rejected = tries & ~accepted
            if q is not None:  # the next sibling was drawn from q without x
                q = torch.where(rejected[:, None], _renormalise(q.scatter(1, token, 0.0), q), q)
            residual = torch.where(rejected[:, None], rejected_residual, residual)
            node = torch.where(accepted, child, node)
            moved |= accepted
        alive &= moved
        residual = torch.where(moved[:, None], _rows(p_all, node), residual)
    path, lengths = path_to(tree.visible, node, tree.depth_bound + 1)
    return Acceptance(path, lengths, sample(residual, generator))


def committed_path(acc: Acceptance, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the path's slots (1, A), which are real (B, A), and the tokens they commit (B, A):
    the accepted drafts after the root, then the bonus token."""
    slot = torch.arange(acc.path.shape[1], device=acc.path.device)[None]
    real = slot < acc.lengths[:, None]
    path_tokens = tree.tokens.gather(1, acc.path)  # root + accepted drafts
    shifted = torch.cat([path_tokens[:, 1:], acc.bonus[:, None]], dim=1)
    return slot, real, torch.where(slot == acc.lengths[:, None] - 1, acc.bonus[:, None], shifted)

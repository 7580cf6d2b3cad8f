"""Drafting a token tree with a drafter: static (fixed index paths) or dynamic (EAGLE-2).

Candidates under a node: greedy decoding takes the draft's top-k. Sampling with a static tree
DRAWS the children without replacement from the warped draft distribution q (recorded in
`DraftTree.draft_probs`, so acceptance can use q exactly). A dynamic tree's shape depends on the
draft's scores, which would bias draws kept by score, so its children are the deterministic
top-k and acceptance treats each as a one-point proposal (still exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.draft_tree import DraftTree, children_from_parents
from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import Generator, order_without_replacement, probabilities, warp_logits
from headstart.inference.tree import TreeBuffers


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 expansion: `depth` draft steps, `top_k` children per frontier node and frontier
    width, then the best `total_tokens` drafted nodes (root excluded) by cumulative log-prob."""

    depth: int = 4
    top_k: int = 4
    total_tokens: int = 12

    def levels(self, max_depth: int | None) -> int:
        """Draft steps taken: `depth`, cut to how deep the heads can draft."""
        return min(self.depth, max_depth) if max_depth else self.depth

    def pool(self, max_depth: int | None) -> int:
        """Nodes drafted before the cut, root included."""
        return 1 + self.top_k + (self.levels(max_depth) - 1) * self.top_k**2

    def kept(self, max_depth: int | None) -> int:
        """Drafted nodes kept for the verify (root excluded)."""
        return min(self.total_tokens, self.pool(max_depth) - 1)

    def __post_init__(self) -> None:
        from headstart.inference.tree import MAX_TOP_K, MAX_TREE_DEPTH, MAX_TREE_NODES

        bounds = {"depth": MAX_TREE_DEPTH, "top_k": MAX_TOP_K, "total_tokens": MAX_TREE_NODES}
        for name, most in bounds.items():
            if not 1 <= getattr(self, name) <= most:
                raise HeadstartError(
                    f"dynamic tree {name} must be in 1..{most}, got {getattr(self, name)}",
                    "e.g. --tree dynamic:depth=6,top_k=10,total_tokens=60",
                )


@dataclass(frozen=True)
class StaticPlan:
    """A static tree's per-level drafting plan with its buffers on one device, built once: the
    draft loop then reads no data-dependent widths and copies nothing host-to-device per step."""

    tree: TreeBuffers
    buffers: dict[str, torch.Tensor]  # parents, depths, visible, children on the device
    levels: tuple[tuple[torch.Tensor, torch.Tensor, int], ...]
    """Per depth: (frontier node ids (m,), their children's node ids (m, C), C = the widest
    frontier node's child count; a missing child points at a scratch column n)."""
    expanding: tuple[torch.Tensor | None, ...]  # per depth: the next frontier on the device (None: done)
    max_depth: int


_PLANS: dict[tuple[int, str], StaticPlan] = {}


def static_plan(tree: TreeBuffers, device: torch.device) -> StaticPlan:
    """The plan of `tree` on `device`, cached (trees are frozen; the plan keeps its tree alive, so
    the id key is never reused while cached)."""
    key = (id(tree), str(device))
    plan = _PLANS.get(key)
    if plan is not None and plan.tree is tree:
        return plan
    buffers = {name: getattr(tree, name).to(device) for name in ("parents", "depths", "visible", "children")}
    levels, expanding = [], []
    frontier = torch.zeros(1, dtype=torch.long)
    for depth in range(tree.max_depth):
        kids = tree.children[frontier]  # (m, C) on the host, once
        width = int((kids >= 0).sum(-1).max())
        slots = kids[:, :width]
        into = torch.where(slots >= 0, slots, tree.size)
        levels.append((frontier.to(device), into.to(device), width))
        frontier = tree.expanding(depth + 1)
        expanding.append(frontier.to(device) if frontier.numel() else None)
        if frontier.numel() == 0:
            break
    plan = StaticPlan(tree, buffers, tuple(levels), tuple(expanding), tree.max_depth)
    if len(_PLANS) > 64:  # many decoders in one process (tests): keep the cache bounded
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def draft_static(tree: TreeBuffers, drafter: Any, root: torch.Tensor, sampling: SamplingConfig,
                 generator: Generator = None) -> DraftTree:  # fmt: skip
    """Fill a static tree level by level; each level's frontier is one batched drafter call.
    Shapes come from the tree (StaticPlan), never from the drafted data: no host sync."""
    batch, n, device = root.shape[0], tree.size, root.device
    plan = static_plan(tree, device)
    # column n is scratch: padded child slots (-1 in the plan) write there, since a boolean index
    # would read its count back from the device
    tokens = torch.zeros(batch, n + 1, dtype=torch.long, device=device)
    tokens[:, 0] = root
    valid = torch.ones(batch, n + 1, dtype=torch.bool, device=device)
    visible = plan.buffers["visible"].expand(batch, n, n)
    parents = plan.buffers["parents"]
    draft_probs = None
    # a root-only tree (a plain step) asks the drafter for nothing (EAGLE-3's root logits are a
    # draft lm_head per row and a scatter to the target vocabulary)
    logits = drafter.root_logits()[:, None] if plan.levels else None  # (B, 1, V)
    for depth, (frontier, into, width) in enumerate(plan.levels):
        if sampling.greedy:
            cand = logits.topk(width, dim=-1).indices  # (B, m, C)
            ok = torch.ones_like(cand, dtype=torch.bool)
        else:
            q = probabilities(logits, sampling)  # (B, m, V)
            if draft_probs is None:
                draft_probs = q.new_zeros(batch, n, q.shape[-1])
            draft_probs[:, frontier] = q
            cand, ok = order_without_replacement(q, width, generator)
        tokens[:, into] = cand  # (B, m, C)
        valid[:, into] = ok
        nxt = plan.expanding[depth]
        if nxt is None:
            break
        nodes = nxt.expand(batch, -1)
        logits = drafter.expand(nodes, parents[nxt].expand(batch, -1), tokens[:, nxt], depth + 1, visible)
    return DraftTree.from_static(tree, tokens[:, :n], valid[:, :n], draft_probs, plan.buffers, plan.max_depth)


def draft_dynamic(
    spec: DynamicTree, drafter: Any, root: torch.Tensor, sampling: SamplingConfig, max_depth: int | None
) -> DraftTree:
    """EAGLE-2: expand the top_k best frontier nodes for `depth` steps, keep the best total_tokens."""
    depth, size = spec.levels(max_depth), spec.pool(max_depth)
    k, batch, device = spec.top_k, root.shape[0], root.device
    tokens = torch.zeros(batch, size, dtype=torch.long, device=device)
    parent = torch.zeros(batch, size, dtype=torch.long, device=device)
    level = torch.zeros(batch, size, dtype=torch.long, device=device)
    score = torch.zeros(batch, size, device=device)  # cumulative draft log-prob; root 0
    visible = torch.eye(size, dtype=torch.bool, device=device).expand(batch, size, size).clone()
    tokens[:, 0] = root
    rows = torch.arange(batch, device=device)[:, None]

    def add(
        start: int, new_tokens: torch.Tensor, new_parents: torch.Tensor, new_scores: torch.Tensor, d: int
    ) -> torch.Tensor:
        end = start + new_tokens.shape[1]
        ids = torch.arange(start, end, device=device).expand(batch, -1)
        # slices, not ids[0]: advanced-index assignment of the scalar d copies it to the device
        # from pageable memory, a host sync per depth on CUDA (tests/inference/test_host_syncs.py)
        tokens[:, start:end], parent[:, start:end], score[:, start:end] = new_tokens, new_parents, new_scores
        level[:, start:end] = d
        visible[rows, ids] |= visible[rows, new_parents]  # ancestors of the parent, plus self (eye)
        return ids

    def log_probs(logits: torch.Tensor) -> torch.Tensor:
        return warp_logits(logits, sampling).log_softmax(-1)  # -inf where the warped q is 0

    first = log_probs(drafter.root_logits()).topk(k, dim=-1)  # (B, k)
    frontier = add(1, first.indices, torch.zeros_like(first.indices), first.values, 1)
    start = 1 + k
    for d in range(2, depth + 1):
        logits = drafter.expand(
            frontier, parent.gather(1, frontier), tokens.gather(1, frontier), d - 1, visible
        )
        top = log_probs(logits).topk(k, dim=-1)  # (B, k, k)
        cum = score.gather(1, frontier)[..., None] + top.values  # (B, k, k)
        ids = add(
            start, top.indices.flatten(1), frontier[..., None].expand(-1, -1, k).flatten(1), cum.flatten(1), d
        )
        start += k * k
        frontier = ids.gather(1, cum.flatten(1).topk(k, dim=-1).indices)
    # Stable sort, best first: a child never outscores its parent and parents come first in the
    # pool, so any kept child's parent is kept too (the selection is a tree).
    keep = spec.kept(max_depth)
    best = score[:, 1:].argsort(dim=1, descending=True, stable=True)[:, :keep] + 1
    chosen = torch.cat(
        [torch.zeros(batch, 1, dtype=torch.long, device=device), best.sort(dim=1).values], dim=1
    )
    where = torch.full((batch, size), -1, dtype=torch.long, device=device)
    where[rows, chosen] = torch.arange(keep + 1, device=device).expand(batch, -1)
    new_parents = where.gather(1, parent.gather(1, chosen))  # (B, n)
    sel_scores = score.gather(1, chosen)
    n = keep + 1
    tree_visible = visible.gather(1, chosen[..., None].expand(-1, -1, size)).gather(
        2, chosen[:, None, :].expand(-1, n, -1)
    )
    return DraftTree(
        tokens=tokens.gather(1, chosen),
        parents=new_parents,
        depths=level.gather(1, chosen),
        visible=tree_visible,
        # a node's children are among its top_k expansions: top_k bounds the width statically
        children=children_from_parents(new_parents, sel_scores, max(1, min(k, keep))),
        valid=sel_scores > float("-inf"),
        draft_probs=None,
        max_depth=depth,
    )

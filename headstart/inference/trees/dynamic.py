"""EAGLE-2's dynamic tree: its shape (`DynamicTree`) and its drafting (`draft_dynamic`).

A dynamic tree's shape depends on the draft's scores, which would bias draws kept by score, so its
children are the deterministic top-k and acceptance treats each as a one-point proposal (still
exact, also with a lookup branch beside it under sampling).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import warp_logits
from headstart.inference.trees.draft import DraftTree, RoundPlan, children_from_parents


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

    # ---- the Tree protocol (headstart.inference.trees) ----
    samples_with_lookup = True
    """Its children are deterministic top-k (one-point proposals): a lookup branch stays exact."""

    def verify_nodes(self, max_depth: int | None) -> int:
        return 1 + self.kept(max_depth)

    def verify_bound(self) -> int:
        return self.total_tokens + 1

    def draft_nodes(self, max_depth: int | None, lookup: int) -> int:
        return self.pool(max_depth)

    def prepare(self, device: torch.device) -> None:
        """Nothing: its shape is drafted each step."""

    def round_plan(self, device: torch.device, max_depth: int | None) -> RoundPlan:
        """Its draft has fixed sizes (the pool, the kept nodes) whatever the scores choose."""
        draft = functools.partial(_draft_program, self, max_depth=max_depth)
        levels = self.levels(max_depth)  # every level after the first expands top_k frontier nodes
        return RoundPlan(1 + self.kept(max_depth), levels, (levels - 1) * self.top_k, draft)

    reads_context = False
    """It drafts from the heads alone, not from the rows' committed tokens."""

    def check_sampling(self) -> None:
        """Every drafted tree of it decodes exactly under sampling."""

    def draft(self, drafter: Any, root: torch.Tensor, sampling: SamplingConfig, generator: Any,
              max_depth: int | None, contexts: Any = None) -> DraftTree:  # fmt: skip
        return draft_dynamic(self, drafter, root, sampling, max_depth)

    def __post_init__(self) -> None:
        from headstart.inference.trees.static import MAX_TOP_K, MAX_TREE_DEPTH, MAX_TREE_NODES

        bounds = {"depth": MAX_TREE_DEPTH, "top_k": MAX_TOP_K, "total_tokens": MAX_TREE_NODES}
        for name, most in bounds.items():
            if not 1 <= getattr(self, name) <= most:
                raise HeadstartError(
                    f"dynamic tree {name} must be in 1..{most}, got {getattr(self, name)}",
                    "e.g. --tree dynamic:depth=6,top_k=10,total_tokens=60",
                )


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


def _draft_program(spec: DynamicTree, drafter: Any, root: torch.Tensor, sampling: SamplingConfig,
                   generator: Any, max_depth: int | None) -> DraftTree:  # fmt: skip
    """`draft_dynamic` in a round program: the same deterministic draft the steps make (scored by
    the warped draft distribution: it draws nothing), `sampling` a round program's warp
    (captured_round.warp_of)."""
    return draft_dynamic(spec, drafter, root, sampling, max_depth)

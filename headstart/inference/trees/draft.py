"""One decoding step's token tree, batched: every row has n nodes (row trees may differ in shape).

Invariant relied on everywhere: a node's parent has a smaller index (parents precede children),
so the ancestors of a node in increasing index order are its root-to-node path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from headstart.inference.plain import SamplingConfig

if TYPE_CHECKING:  # an annotation only: static.py builds DraftTrees
    from headstart.inference.trees.static import TreeBuffers


@dataclass
class DraftTree:
    tokens: torch.Tensor  # (B, n) long; tokens[:, 0] is the root
    parents: torch.Tensor  # (B, n) long; parents[:, 0] == 0
    depths: torch.Tensor  # (B, n) long
    visible: torch.Tensor  # (B, n, n) bool: ancestor-or-self
    children: torch.Tensor  # (B, n, C) long, in the order acceptance tries them, -1 padded
    valid: torch.Tensor  # (B, n) bool; an invalid candidate is never accepted (exhausted support)
    draft_probs: torch.Tensor | None = None
    """(B, n, V): the warped draft distribution each node's children were DRAWN from (without
    replacement, in child order). None means the children were chosen deterministically, and
    exact sampling then treats each child as a one-point proposal."""
    max_depth: int | None = None
    """An upper bound on `depths`, known before the step (the tree's shape, not its data), so
    acceptance pads to static sizes instead of reading the depth back from the device. None:
    read it from `depths` (a host sync; hand-built trees only)."""

    @property
    def depth_bound(self) -> int:
        """`max_depth`, or the deepest node (a host sync) when the tree did not say."""
        return self.max_depth if self.max_depth is not None else int(self.depths.max())

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    @classmethod
    def from_static(
        cls,
        tree: TreeBuffers,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        draft_probs: torch.Tensor | None,
        buffers: dict[str, torch.Tensor] | None = None,
        max_depth: int | None = None,
    ) -> DraftTree:
        """`buffers`: the tree's parents/depths/visible/children already on the tokens' device
        (trees.static.static_plan), so no host-to-device copy happens per step; `max_depth` the
        tree's depth, known on the host (else read from the CPU buffers)."""
        batch, device = tokens.shape[0], tokens.device
        if buffers is None:
            buffers = {
                name: getattr(tree, name).to(device) for name in ("parents", "depths", "visible", "children")
            }

        def rows(name: str) -> torch.Tensor:
            x = buffers[name]
            return x.expand(batch, *x.shape)

        return cls(
            tokens,
            rows("parents"),
            rows("depths"),
            rows("visible"),
            rows("children"),
            valid,
            draft_probs,
            max_depth=tree.max_depth if max_depth is None else max_depth,
        )


GREEDY = SamplingConfig(max_new_tokens=1)
"""Greedy, as one constant: what a static draft defaults to, and a greedy round program's warp
(so its trace never depends on a generation's other settings)."""


@dataclass(frozen=True)
class RoundPlan:
    """A tree's draft as a round program traces it (inference/captured_round.py): sizes the host
    knows before the round, and `draft(drafter, root, sampling, generator)` -> DraftTree, static
    shapes and no host read, over a drafter that lives inside the program; under sampling its
    draws come from `generator`, uniforms drawn before the program (sampling.PreDrawn)."""

    size: int  # nodes one row's verify holds, the root included
    depth: int  # levels drafted: an accepted path holds at most depth + 1 nodes
    drafted: int  # entries one draft writes into a head's own cache
    draft: Callable[[Any, torch.Tensor, SamplingConfig, Any], DraftTree]
    sampled: int = 0
    """Distributions one draft draws children from under sampling (a static tree: one for each
    frontier node of each level, V uniforms each); 0: deterministic proposals (a dynamic tree)."""

    @property
    def path_width(self) -> int:
        return self.depth + 1


def children_from_parents(
    parents: torch.Tensor, order: torch.Tensor, width: int | None = None
) -> torch.Tensor:
    """parents (B, n) and a sort key (B, n) (higher = tried first) -> children (B, n, C), -1 padded.

    width: C, an upper bound on any node's child count known before the step (a dynamic tree's
    top_k); None reads the widest node's count back from the device (a host sync)."""
    batch, n = parents.shape
    device = parents.device
    nodes = torch.arange(1, n, device=device)
    # Two stable sorts: best-first, then by parent, so siblings are contiguous and best-first.
    by_order = order[:, 1:].argsort(dim=1, descending=True, stable=True)  # (B, n-1)
    by_parent = parents[:, 1:].gather(1, by_order).argsort(dim=1, stable=True)
    child = nodes[by_order.gather(1, by_parent)]  # (B, n-1) node ids, grouped by parent
    par = parents.gather(1, child)  # (B, n-1)
    same = torch.nn.functional.one_hot(par, n)  # (B, n-1, n)
    rank = (same.cumsum(1) * same).sum(-1) - 1  # (B, n-1): rank of each child among its siblings
    if width is None:
        width = int(rank.max()) + 1 if n > 1 else 1  # host sync: the child table's width
    children = torch.full((batch, n, width), -1, dtype=torch.long, device=device)
    children[torch.arange(batch, device=device)[:, None], par, rank] = child
    return children


def path_to(
    visible: torch.Tensor, node: torch.Tensor, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Root-to-node paths: visible (B, n, n), node (B,) -> (path (B, A) node ids, lengths (B,)).

    Rows shorter than A are padded by repeating their last node (safe to gather). A = `width`
    (the tree's depth bound + 1, static: no host sync), or None: the longest path (a host sync)."""
    batch, n, _ = visible.shape
    rows = visible[torch.arange(batch, device=node.device), node]  # (B, n)
    index = torch.arange(n, device=node.device)
    key = torch.where(rows, index, index + n)
    lengths = rows.sum(-1)  # (B,)
    if width is None:
        width = int(lengths.max())  # host sync: the longest accepted path
    width = min(width, n)
    ordered = key.sort(dim=-1).values[:, :width]
    path = torch.where(ordered < n, ordered, node[:, None])
    return path, lengths

"""One decoding step's token tree, batched: every row has n nodes (row trees may differ in shape).

Invariant relied on everywhere: a node's parent has a smaller index (parents precede children),
so the ancestors of a node in increasing index order are its root-to-node path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headstart.inference.tree import TreeBuffers


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

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    @classmethod
    def from_static(
        cls, tree: TreeBuffers, tokens: torch.Tensor, valid: torch.Tensor, draft_probs: torch.Tensor | None
    ) -> DraftTree:
        batch, device = tokens.shape[0], tokens.device

        def rows(x: torch.Tensor) -> torch.Tensor:
            return x.to(device).expand(batch, *x.shape)

        return cls(
            tokens,
            rows(tree.parents),
            rows(tree.depths),
            rows(tree.visible),
            rows(tree.children),
            valid,
            draft_probs,
        )


def children_from_parents(parents: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """parents (B, n) and a sort key (B, n) (higher = tried first) -> children (B, n, C), -1 padded."""
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
    width = int(rank.max()) + 1 if n > 1 else 1  # host sync: the child table's width
    children = torch.full((batch, n, width), -1, dtype=torch.long, device=device)
    children[torch.arange(batch, device=device)[:, None], par, rank] = child
    return children


def path_to(visible: torch.Tensor, node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Root-to-node paths: visible (B, n, n), node (B,) -> (path (B, A) node ids, lengths (B,)).

    Rows shorter than A = max length are padded by repeating their last node (safe to gather)."""
    batch, n, _ = visible.shape
    rows = visible[torch.arange(batch, device=node.device), node]  # (B, n)
    index = torch.arange(n, device=node.device)
    key = torch.where(rows, index, index + n)
    lengths = rows.sum(-1)  # (B,)
    width = int(lengths.max())  # host sync: the longest accepted path
    ordered = key.sort(dim=-1).values[:, :width]
    path = torch.where(ordered < n, ordered, node[:, None])
    return path, lengths

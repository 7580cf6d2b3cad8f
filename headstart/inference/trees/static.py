"""Static token trees (Medusa-style index paths, built once, frozen) and their drafting.

Candidates under a node: greedy decoding takes the draft's top-k. Sampling DRAWS the children
without replacement from the warped draft distribution q (recorded in `DraftTree.draft_probs`, so
acceptance can use q exactly): a lookup branch's tokens, which no draft proposed, cannot be mixed
with such draws under sampling.

Node 0 is the root: the last committed token, not yet in the target's KV cache. A static tree is
a set of index paths: path (i, j) is "the j-th candidate under the i-th candidate of the root";
candidates are ranked by the draft (top-k for greedy, draws without replacement for sampling).
Nodes are stored in (depth, path) order, so every parent precedes its children and ancestors of a
node in index order are its path from the root.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import Generator, order_without_replacement, probabilities
from headstart.inference.trees.draft import GREEDY, DraftTree, RoundPlan

Path = tuple[int, ...]


@dataclass(frozen=True)
class TreeBuffers:
    """A static tree's index tensors (CPU; `DraftTree.from_static` moves them per step)."""

    paths: tuple[Path, ...]  # root excluded, sorted by (depth, path)
    parents: torch.Tensor  # (n,) long; parents[0] == 0 (the root is its own parent)
    depths: torch.Tensor  # (n,) long; root depth 0
    ranks: torch.Tensor  # (n,) long; candidate rank under the parent (root 0)
    visible: torch.Tensor  # (n, n) bool; node i sees node j iff j is i or an ancestor of i
    children: torch.Tensor  # (n, C) long; child node ids by rank, -1 padded
    retrieve: torch.Tensor  # (leaves, depth + 1) long; each root-to-leaf path, -1 padded

    @property
    def size(self) -> int:
        return int(self.parents.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def level(self, depth: int) -> torch.Tensor:
        """Node ids at `depth`, (m,)."""
        return torch.nonzero(self.depths == depth).flatten()

    def expanding(self, depth: int) -> torch.Tensor:
        """Node ids at `depth` that have children: the frontier a drafter must expand, (m,)."""
        has_children = (self.children >= 0).any(-1)
        return torch.nonzero((self.depths == depth) & has_children).flatten()

    @property
    def max_rank(self) -> int:
        return int(self.ranks.max()) + 1

    # ---- the Tree protocol (headstart.inference.trees) ----
    samples_with_lookup = False
    """Sampling draws a static tree's children from q: a lookup branch's tokens cannot be mixed in."""

    def levels(self, max_depth: int | None) -> int:
        return self.max_depth

    def verify_nodes(self, max_depth: int | None) -> int:
        return self.size

    def verify_bound(self) -> int:
        return self.size

    def draft_nodes(self, max_depth: int | None, lookup: int) -> int:
        return self.size + lookup

    def prepare(self, device: torch.device) -> None:
        static_plan(self, device)  # the device buffers, built once

    def round_plan(self, device: torch.device, max_depth: int | None) -> RoundPlan | None:
        if self.size == 1:  # the root alone drafts nothing
            return None
        plan = static_plan(self, device)
        drafted = sum(int(nxt.numel()) for nxt in plan.expanding if nxt is not None)
        sampled = sum(int(frontier.numel()) for frontier, _, _ in plan.levels)
        return RoundPlan(self.size, self.max_depth, drafted, functools.partial(draft_planned, plan), sampled)

    reads_context = False
    """It drafts from the heads alone, not from the rows' committed tokens."""

    def check_sampling(self) -> None:
        """Every drafted tree of it decodes exactly under sampling."""

    def draft(self, drafter: Any, root: torch.Tensor, sampling: SamplingConfig, generator: Generator,
              max_depth: int | None, contexts: Any = None) -> DraftTree:  # fmt: skip
        return draft_static(self, drafter, root, sampling, generator)


# Bounds on what one step drafts and verifies. Published trees use 60 nodes at depth 6-8; past
# these a step costs more than it can save on any device, and the verify's (nodes x context)
# mask and the lookup's proposals grow with them (an unbounded lookup:100000 filled 23 GB).
MAX_TREE_NODES = 256
MAX_TREE_DEPTH = 32
MAX_TOP_K = 64
MAX_LOOKUP_TOKENS = 64


def check_tree_size(nodes: int, depth: int) -> None:
    if nodes > MAX_TREE_NODES or depth > MAX_TREE_DEPTH:
        raise HeadstartError(
            f"the tree has {nodes} nodes at depth {depth}: at most {MAX_TREE_NODES} nodes and depth {MAX_TREE_DEPTH}",
            "use a smaller tree, e.g. --tree dynamic:depth=6,top_k=10,total_tokens=60",
        )


def build_tree(paths: Sequence[Sequence[int]]) -> TreeBuffers:
    """Validate index paths and build the tree buffers."""
    check_tree_size(len(paths), max((len(p) for p in paths), default=0))
    clean: list[Path] = []
    for raw in paths:
        path = tuple(int(i) for i in raw)
        if not path or min(path) < 0:
            raise HeadstartError(
                f"bad tree path {list(raw)}: paths are non-empty lists of ranks >= 0",
                "e.g. [[0], [1], [0, 0]]",
            )
        clean.append(path)
    ordered = sorted(set(clean), key=lambda p: (len(p), p))
    if len(ordered) != len(clean):
        raise HeadstartError("the tree lists a path twice", "remove the duplicate paths")
    index = {(): 0} | {p: i + 1 for i, p in enumerate(ordered)}
    missing = [list(p[:-1]) for p in ordered if p[:-1] not in index]
    if missing:
        raise HeadstartError(
            f"tree paths {missing} are missing (every prefix of a path must be a node)",
            "add the parent paths",
        )
    gaps = [list(p) for p in ordered if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in index]
    if gaps:
        # Candidates are tried in rank order (sampling draws them in that order), so a node's
        # children must be ranks 0..m-1 without holes.
        raise HeadstartError(
            f"tree paths {gaps} skip a rank under their parent", "add the lower-ranked sibling paths"
        )
    n = len(ordered) + 1
    parents = torch.zeros(n, dtype=torch.long)
    ranks = torch.zeros(n, dtype=torch.long)
    depths = torch.zeros(n, dtype=torch.long)
    visible = torch.eye(n, dtype=torch.bool)
    for path, i in index.items():
        if path:
            parents[i], ranks[i], depths[i] = index[path[:-1]], path[-1], len(path)
            visible[i] = visible[index[path[:-1]]]
            visible[i, i] = True
    width = int(ranks.max()) + 1
    children = torch.full((n, width), -1, dtype=torch.long)
    for i in range(1, n):
        children[parents[i], ranks[i]] = i
    leaves = [i for i in range(n) if (children[i] < 0).all()]
    retrieve = torch.full((len(leaves), int(depths.max()) + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        nodes = torch.nonzero(visible[leaf]).flatten()
        retrieve[row, : nodes.numel()] = nodes
    return TreeBuffers(tuple(ordered), parents, depths, ranks, visible, children, retrieve)


def chain(depth: int) -> list[Path]:
    """A single path of `depth` top-1 candidates (classic speculative decoding)."""
    return [(0,) * d for d in range(1, depth + 1)]


# Sized for a 2-core CPU, where verifying 12 tokens costs ~1.4x one token (see DESIGN.md):
# wide near the root where the draft is least sure, a long top-1 spine where it is most sure.
DEFAULT_PATHS: tuple[Path, ...] = (
    (0,), (1,), (2,),
    (0, 0), (0, 1), (1, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 0, 0),
)  # fmt: skip


ROOT_ONLY = build_tree([])
"""The root alone: a plain step, and plain decoding's tree (with any lookup branch under it)."""


def default_tree(max_depth: int | None = None) -> TreeBuffers:
    """The default static tree, cut to `max_depth` (a Medusa head with K heads drafts K levels)."""
    paths = [p for p in DEFAULT_PATHS if max_depth is None or len(p) <= max_depth]
    return build_tree(paths)


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
    return draft_planned(static_plan(tree, root.device), drafter, root, sampling, generator)


def draft_planned(plan: StaticPlan, drafter: Any, root: torch.Tensor, sampling: SamplingConfig = GREEDY,
                  generator: Generator = None) -> DraftTree:  # fmt: skip
    """`draft_static` over its plan (what a round program traces, its draws pre-drawn: no plan
    lookup inside)."""
    tree = plan.tree
    batch, n, device = root.shape[0], tree.size, root.device
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

"""Lookahead decoding's tree (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding"; llama.cpp's examples/lookahead): one verify forward holds, under the
root,

* the verification branch: up to `guesses` n-grams from the pool that open with the root token,
  plus the prompt-lookup match of the context's last n-gram, each N - 1 tokens;
* the lookahead branch: a 2D Jacobi window of N - 1 levels x W columns. Column i is the path
  root, L0[1], ..., L0[i], L1[i], ..., L(N-2)[i] (L0[0] is the root itself), so the level-0 tokens
  form a trunk and each column's deeper levels hang off it: exactly the attention the paper's
  mask gives, as a token tree. The target's output at each column's last node is the next Jacobi
  iterate of that column (the drafter's `verified`).

Every sequence is merged into one trie (a shared prefix is one node: the same path gives the same
logits, and greedy acceptance then sees each candidate once), padded to a fixed node count so
every step's verify has one shape. Every node is a deterministic proposal (`draft_probs` None):
greedy acceptance takes the deepest agreeing path, exact sampling treats each child as a
one-point proposal (inference/verify.py), so the output is the target's whatever the pool holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.plain import SamplingConfig
from headstart.inference.trees.draft import DraftTree

PREFIX = "lookahead"
USAGE = "use lookahead or lookahead:window=5,ngram=4,guesses=4"


@dataclass(frozen=True)
class LookaheadTree:
    """W (`window`) Jacobi columns, n-grams of N (`ngram`) tokens, up to G (`guesses`) pool
    n-grams verified per step (plus one prompt-lookup match)."""

    window: int = 5
    ngram: int = 4
    guesses: int = 4

    def __post_init__(self) -> None:
        from headstart.inference.trees.static import MAX_TREE_NODES

        if not (1 <= self.window <= 64 and 2 <= self.ngram <= 16 and 0 <= self.guesses <= 64):
            raise HeadstartError(
                f"bad lookahead sizes (window={self.window}, ngram={self.ngram}, guesses={self.guesses})",
                "window 1..64, ngram 2..16, guesses 0..64; " + USAGE,
            )
        if self.nodes > MAX_TREE_NODES:
            raise HeadstartError(
                f"lookahead window={self.window}, ngram={self.ngram}, guesses={self.guesses} verifies "
                f"{self.nodes} nodes a step, more than {MAX_TREE_NODES}",
                "use a smaller window or fewer guesses",
            )

    @property
    def candidates(self) -> int:
        """Verification sequences per step: the pool's guesses and one prompt-lookup match."""
        return self.guesses + 1

    @property
    def nodes(self) -> int:
        """Nodes of one row's verify, root included (before merging shared prefixes)."""
        return 1 + self.candidates * (self.ngram - 1) + (self.window - 1) + self.window * (self.ngram - 2)

    @property
    def depth(self) -> int:
        """The deepest node: a column's last level, or a guess."""
        return max(self.ngram - 1, self.window - 1 + self.ngram - 2)

    @property
    def text(self) -> str:
        return f"{PREFIX}:window={self.window},ngram={self.ngram},guesses={self.guesses}"

    # ---- the Tree protocol (headstart.inference.trees) ----
    samples_with_lookup = True
    """Every node is a deterministic proposal: exact under sampling, lookup match included."""

    def levels(self, max_depth: int | None) -> int:
        return self.depth

    def verify_nodes(self, max_depth: int | None) -> int:
        return self.nodes

    def verify_bound(self) -> int:
        return self.nodes

    def draft_nodes(self, max_depth: int | None, lookup: int) -> int:
        return self.nodes + lookup

    def prepare(self, device: torch.device) -> None:
        """Nothing: its shape is built each step."""

    def round_plan(self, device: torch.device, max_depth: int | None) -> None:
        """None: its drafter (the Jacobi window) drafts it, outside any program."""

    reads_context = False
    """It drafts from the heads alone, not from the rows' committed tokens."""

    def check_sampling(self) -> None:
        """Every drafted tree of it decodes exactly under sampling."""

    def draft(self, drafter: Any, root: torch.Tensor, sampling: SamplingConfig, generator: Any,
              max_depth: int | None, contexts: Any = None) -> DraftTree:  # fmt: skip
        """The lookahead drafter (drafters/lookahead.py) keeps each row's window and pool."""
        return drafter.propose(self, root)


def parse_lookahead(spec: str) -> LookaheadTree:
    """'lookahead' or 'lookahead:window=5,ngram=4,guesses=4' -> a LookaheadTree (one line on errors)."""
    head, _, options = spec.partition(":")
    if head != PREFIX:
        raise HeadstartError(f"not a lookahead spec: '{spec}'", USAGE)
    if spec == PREFIX:
        return LookaheadTree()
    from headstart.inference.trees.options import int_options

    return LookaheadTree(**int_options(spec, options, ("window", "ngram", "guesses"), USAGE))


def trie(sequences: list[list[Sequence[int]]], root: list[int], size: int, depth: int,
         device: torch.device) -> tuple[DraftTree, list[list[int]]]:  # fmt: skip
    """Per row, `sequences` (token lists that follow the root) merged into one trie under the
    row's `root` token, padded to `size` nodes -> (the batched DraftTree, per row the node
    id where each sequence ends: 0 for an empty one). `depth`: a bound on the sequences'
    lengths (static, so acceptance keeps one shape).

    Built on the host (the pool and the window live there) and copied to the device in one
    transfer. Children are tried in the order their sequences come (the pool's guesses before the
    window)."""
    batch = len(root)
    tokens = [[r] + [0] * (size - 1) for r in root]
    parents = [[0] * size for _ in range(batch)]
    depths = [[0] * size for _ in range(batch)]
    valid = [[True] + [False] * (size - 1) for _ in range(batch)]
    children: list[list[list[int]]] = [[[] for _ in range(size)] for _ in range(batch)]
    ends: list[list[int]] = []
    for b, rows in enumerate(sequences):
        index = {}  # (parent node, token) -> node
        count, row_ends = 1, []
        for seq in rows:
            node = 0
            for token in seq:
                child = index.get((node, token))
                if child is None:
                    if count == size:
                        raise AssertionError("the lookahead trie outgrew its node count")
                    child, count = count, count + 1
                    index[(node, token)] = child
                    tokens[b][child], parents[b][child] = token, node
                    depths[b][child], valid[b][child] = depths[b][node] + 1, True
                    children[b][node].append(child)
                node = child
            if depths[b][node] > depth:
                raise AssertionError("a lookahead sequence is deeper than its bound")
            row_ends.append(node)
        ends.append(row_ends)
    width = max(1, max(len(c) for row in children for c in row))
    # every field as one host tensor (B, n, 4 + n + width), moved in ONE copy and split on the
    # device; the ancestor matrix built on the host from the parents (they precede children)
    fields = torch.zeros(batch, size, 4 + size + width, dtype=torch.long)
    fields[:, :, 0], fields[:, :, 1] = torch.tensor(tokens), torch.tensor(parents)
    fields[:, :, 2], fields[:, :, 3] = torch.tensor(depths), torch.tensor(valid)
    seen = fields[:, :, 4 : 4 + size].numpy()  # a view: filled in place
    for b in range(batch):
        for node in range(size):
            if node:
                seen[b, node] = seen[b, parents[b][node]]
            seen[b, node, node] = 1
    fields[:, :, 4 + size :] = torch.tensor([[c + [-1] * (width - len(c)) for c in row] for row in children])
    moved = fields.to(device)
    return DraftTree(
        tokens=moved[:, :, 0],
        parents=moved[:, :, 1],
        depths=moved[:, :, 2],
        visible=moved[:, :, 4 : 4 + size].bool(),
        children=moved[:, :, 4 + size :],
        valid=moved[:, :, 3].bool(),
        draft_probs=None,
        max_depth=depth,
    ), ends

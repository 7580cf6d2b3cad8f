"""A prompt-lookup branch under the root of the heads' tree (`--tree chain:1+lookup:4`).

Why: a verify forward of up to 8 tree nodes costs little more than one of 2 on a CPU with packed
weights (targets/packing.py), and copying from the context (code, quoted text, names, lists) is
what trained heads miss and prompt-lookup decoding gets for free. So each step also proposes the
tokens that followed the most recent earlier occurrence of the context's last n-gram, as a chain
under the root beside the heads' own drafts; the verify takes whichever path the target agrees
with furthest. No extra forward, no model.

Exactness: greedy acceptance takes the deepest path of argmax tokens, wherever it comes from.
With sampling, the chain's nodes are deterministic proposals, which exact tree rejection sampling
treats as one-point proposals; that is exact only when every child of the root is one (a dynamic
tree, or greedy), so a tree whose root's children were DRAWN from the draft distribution (a static
tree under sampling) gets no lookup branch (`extend_with_lookup` refuses it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headstart.errors import HeadstartError
from headstart.inference.trees.draft import DraftTree

SUFFIX = "+lookup:"


@dataclass(frozen=True)
class Lookup:
    """Propose up to `tokens` tokens after the latest earlier match of the last `max_ngram` ...
    `min_ngram` tokens of the context (longest n-gram first)."""

    tokens: int = 4
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        from headstart.inference.trees.static import MAX_LOOKUP_TOKENS

        if not 1 <= self.tokens <= MAX_LOOKUP_TOKENS or not 1 <= self.min_ngram <= self.max_ngram:
            raise HeadstartError(
                f"bad lookup branch (tokens={self.tokens}, n-grams {self.min_ngram}..{self.max_ngram})",
                f"use e.g. --tree chain:1+lookup:4 (1 to {MAX_LOOKUP_TOKENS} looked-up tokens)",
            )

    def propose(self, context: Sequence[int] | np.ndarray | torch.Tensor) -> list[int]:
        """context (L,) committed tokens, the root last -> up to `tokens` proposals (may be none).

        Host-side (numpy): the decoder passes the committed tokens that its one device read per
        step already brought back, so matching costs no device sync."""
        if isinstance(context, torch.Tensor):
            context = context.tolist()
        ctx = np.asarray(context, dtype=np.int64)
        length = ctx.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            # windows of ctx[:-1] start at 0 .. L-1-n: every earlier n-gram, not the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)  # (L - n, n), a view
            hits = np.flatnonzero((windows == ctx[-n:]).all(1))
            if hits.size:
                start = int(hits[-1]) + n  # the most recent match
                return ctx[start : start + self.tokens].tolist()
        return []

    def propose_rows(
        self, contexts: Sequence[Sequence[int] | torch.Tensor], device: torch.device | str = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One context per row -> tokens (B, tokens) and found (B, tokens) bool, on `device`
        (one host-to-device copy, non-blocking: the host buffer is fresh and never reused)."""
        rows = len(contexts)
        tokens = torch.zeros(rows, self.tokens, dtype=torch.long)
        found = torch.zeros(rows, self.tokens, dtype=torch.bool)
        for row, context in enumerate(contexts):
            guess = self.propose(context)
            tokens[row, : len(guess)] = torch.tensor(guess, dtype=torch.long)
            found[row, : len(guess)] = True
        both = torch.cat([tokens, found.long()], 1).to(device, non_blocking=True)
        return both[:, : self.tokens], both[:, self.tokens :].bool()


@dataclass(frozen=True)
class WithLookup:
    """A tree with a prompt-lookup branch under its root (`--tree chain:1+lookup:4`), keeping the
    Tree protocol over both: its counts include the branch, its draft appends it (from the rows'
    committed tokens, `contexts`), and it refuses sampling where the branch would not be exact."""

    base: Any
    """The drafted tree (a Tree; the root alone for plain decoding with a lookup branch)."""
    lookup: Lookup

    reads_context = True
    """Its draft needs each row's committed tokens (the engine passes them)."""

    @property
    def samples_with_lookup(self) -> bool:
        return self.base.samples_with_lookup

    def check_sampling(self) -> None:
        """The one rule (module docstring): a lookup branch beside children DRAWN from the draft
        distribution (a static tree's) cannot be accepted exactly."""
        if not self.base.samples_with_lookup:
            raise HeadstartError(
                "a lookup branch with sampling needs a dynamic tree (a static tree's drafts are drawn "
                "from the draft distribution, and exact acceptance cannot mix those with looked-up tokens)",
                "use --tree dynamic+lookup:4, or decode greedily",
            )

    def levels(self, max_depth: int | None) -> int:
        return self.base.levels(max_depth)

    def verify_nodes(self, max_depth: int | None) -> int:
        return self.base.verify_nodes(max_depth) + self.lookup.tokens

    def verify_bound(self) -> int:
        return self.base.verify_bound() + self.lookup.tokens

    def draft_nodes(self, max_depth: int | None, lookup: int) -> int:
        return self.base.draft_nodes(max_depth, lookup + self.lookup.tokens)

    def prepare(self, device: torch.device) -> None:
        self.base.prepare(device)

    def round_plan(self, device: torch.device, max_depth: int | None) -> None:
        """None: the lookup branch reads each row's context."""

    def draft(self, drafter: Any, root: torch.Tensor, sampling: Any, generator: Any, max_depth: int | None,
              contexts: Sequence[Sequence[int]] | None = None) -> DraftTree:  # fmt: skip
        tree = self.base.draft(drafter, root, sampling, generator, max_depth)
        if contexts is None:
            return tree
        return extend_with_lookup(tree, *self.lookup.propose_rows(contexts, root.device))


def split_lookup(spec: str | None) -> tuple[str | None, Lookup | None]:
    """'chain:1+lookup:4' -> ('chain:1', Lookup(tokens=4)); anything else -> (spec, None)."""
    if not isinstance(spec, str) or SUFFIX not in spec:
        return spec, None
    base, _, count = spec.partition(SUFFIX)
    if not (count.isascii() and count.isdigit()):  # "²" is a digit, not an int
        raise HeadstartError(f"bad lookup branch in tree '{spec}'", "use e.g. --tree chain:1+lookup:4")
    return base or None, Lookup(tokens=int(count))


def extend_with_lookup(tree: DraftTree, tokens: torch.Tensor, found: torch.Tensor) -> DraftTree:
    """Append a chain of looked-up `tokens` (B, m) under the root; `found` (B, m) marks real ones
    (a row without a match gets invalid nodes: the same node count keeps one packed verify shape)."""
    if tree.draft_probs is not None:
        raise HeadstartError(
            "a lookup branch cannot join a tree whose children were drawn from the draft (static tree, sampling)",
            "sample with a dynamic tree (--tree dynamic+lookup:4), or decode greedily",
        )
    batch, n = tree.tokens.shape
    m = tokens.shape[1]
    device = tree.tokens.device
    chain = torch.arange(n, n + m, device=device)  # node ids of the branch
    parents = torch.cat([torch.zeros(1, dtype=torch.long, device=device), chain[:-1]])  # root, then chain
    visible = torch.zeros(batch, n + m, n + m, dtype=torch.bool, device=device)
    visible[:, :n, :n] = tree.visible
    visible[:, n:, 0] = True  # every branch node sees the root ...
    visible[:, n:, n:] = torch.ones(m, m, dtype=torch.bool, device=device).tril()  # ... and its chain
    width = tree.children.shape[2] + 1
    children = torch.full((batch, n + m, width), -1, dtype=torch.long, device=device)
    children[:, :n, : width - 1] = tree.children
    children[:, 0, width - 1] = n  # tried after the heads' own children of the root
    children[:, n:-1, 0] = chain[1:]
    return DraftTree(
        tokens=torch.cat([tree.tokens, tokens], 1),
        parents=torch.cat([tree.parents, parents.expand(batch, -1)], 1),
        depths=torch.cat([tree.depths, torch.arange(1, m + 1, device=device).expand(batch, -1)], 1),
        visible=visible,
        children=children,
        valid=torch.cat([tree.valid, found.cumprod(1).bool()], 1),
        draft_probs=None,
        max_depth=None if tree.max_depth is None else max(tree.max_depth, m),
    )

"""Lookahead decoding's drafter: no model, no training. Per row it keeps the committed context,
the 2D Jacobi window (N - 1 levels of W tokens) and the n-gram pool the window's trajectories
fill; each step it proposes the tree of inference/trees/lookahead.py and reads the target's own
outputs at the window's columns back from that same verify (`verified`), the next Jacobi level.

    --draft-model lookahead                                 W=5, N=4, G=4 (llama.cpp: 15, 5, 15)
    --draft-model lookahead:window=15,ngram=5,guesses=15

The window after a step (llama.cpp's update, with its shift when more than one token is
accepted): the levels move up one (level j <- level j + 1), the last level becomes the outputs,
and every column's trajectory (L0[f], L1[f], ..., L(N-2)[f], output f) enters the pool keyed by
its first token, at most G n-grams per key (the oldest is dropped). Accepting k tokens moves the
window's frame k - 1 further: its columns shift left by k - 1 and the freed ones are refilled
from the context. The pool and the window are host-side (Python lists), as in LADE and
llama.cpp: cost, one extra device-to-host read per step (the committed tokens and the W outputs,
read together in `observe`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.inference.trees.lookahead import LookaheadTree, parse_lookahead, trie
from headstart.inference.trees.lookup import Lookup
from headstart.inference.trees.spec import TreeChoice, choose_tree

TUNE_SIZES = ("window=2,ngram=3,guesses=1", "window=3,ngram=3,guesses=2", "window=5,ngram=4,guesses=4",
              "window=8,ngram=4,guesses=6", "window=15,ngram=5,guesses=15")  # fmt: skip
"""What a tune of bare `lookahead` compares: CPU-sized windows up to the paper's GPU sizes."""


# ---- its registration's pieces (headstart/catalogue.py) ----
def load(target: Any, spec: str, tree: Any, greedy: bool) -> tuple[Lookahead, TreeChoice]:
    """`--draft-model lookahead[:window=W,ngram=N,guesses=G]`: its own tree, greedy or sampled
    alike (every node a deterministic proposal)."""
    if tree is not None:
        raise HeadstartError(
            "lookahead decoding builds its own tree each step: --tree does not apply",
            "drop --tree, or size the lookahead: --draft-model lookahead:window=5,ngram=4,guesses=4",
        )
    sizes = parse_lookahead(spec)
    return Lookahead(sizes), choose_tree(sizes)


def tune_candidates(target: Any) -> list[str]:
    return [f"lookahead:{sizes}" for sizes in TUNE_SIZES]


def default_spec(target: Any) -> str:
    return "lookahead"  # its default sizes


@dataclass(frozen=True)
class Lookahead:
    """What the decoder takes where it takes heads: Lookahead decoding with `tree`'s sizes.
    Nothing to load or train; `new_drafter` makes each batch's drafter (the decoder asks
    `inference.drafters.make_drafter`)."""

    tree: LookaheadTree

    @property
    def describe(self) -> str:
        return "lookahead decoding"

    def bind(self, target_model: Any) -> None:
        """Nothing to attach: it reads only the target's verify logits."""

    def new_drafter(self, vocab_size: int, depth: int | None = None) -> LookaheadDrafter:
        return LookaheadDrafter(self.tree)


class LookaheadDrafter:
    """One batch's windows and pools, a row each (rows come and go with requests)."""

    feature_layers: tuple[int, ...] = ()  # reads the verify's logits, no hidden states
    max_depth: int | None = None

    def __init__(self, spec: LookaheadTree) -> None:
        self.spec = spec
        self.lookup = Lookup(tokens=spec.ngram - 1)  # the prompt-lookup match, beside the pool's
        self.contexts: list[list[int]] = []  # committed tokens per row, the next root last
        self.levels: list[list[list[int]]] = []  # per row: N - 1 levels of W tokens
        self.pools: list[dict[int, list[tuple[int, ...]]]] = []  # per row: first token -> n-gram tails
        self.first: list[int] | None = None  # the prompt's first tokens (`start`, the prefill)
        self.drafted: Any = None  # the tree this step proposed
        self.roots: list[int] = []  # each row's root when it was proposed
        self.ends: torch.Tensor | None = None  # (B, W) node ids of the window's columns
        self.outputs: torch.Tensor | None = None  # (B, W) the target's argmax there (`verified`)

    # ---- the decoder's calls ----
    def start(self, first_tokens: torch.Tensor) -> None:
        self.first = first_tokens.tolist()

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        parts = [next_tokens, valid.long()]
        if self.outputs is not None:
            parts.append(self.outputs)
        width = next_tokens.shape[1]
        host = torch.cat(parts, 1).tolist()  # host sync: the pool and the window live on the host
        if not self.contexts:  # the prefill: each row's prompt
            assert self.first is not None, "the prefill hands the first tokens to `start` first"
            self.contexts = [[first] for first in self.first]
            self.levels = [[] for _ in host]
            self.pools = [{} for _ in host]
            self.first = None
        for row, values in enumerate(host):
            tokens, real = values[:width], values[width : 2 * width]
            new = [t for t, ok in zip(tokens, real, strict=True) if ok]
            self.contexts[row] += new
            if self.outputs is not None:
                self._advance(row, values[2 * width :], len(new))
            elif not self.levels[row]:
                self.levels[row] = self._fill(row, self.spec.ngram - 1, self.spec.window)
        self.outputs = None

    def root_logits(self) -> torch.Tensor:
        return torch.zeros(len(self.contexts), 1)  # a plain step's root-only tree ranks nothing

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        raise AssertionError("lookahead trees are proposed whole, never expanded")

    def propose(self, spec: LookaheadTree, root: torch.Tensor) -> Any:
        """This step's tree: the pool's guesses for each root (newest first), the prompt-lookup
        match, then the window's columns."""
        self.roots = [context[-1] for context in self.contexts]  # the root: no device read
        sequences, window = [], spec.window
        for row, context in enumerate(self.contexts):
            guesses = [list(tail) for tail in reversed(self.pools[row].get(context[-1], []))]
            match = self.lookup.propose(context)
            levels = self.levels[row]
            columns = [levels[0][1 : i + 1] + [level[i] for level in levels[1:]] for i in range(window)]
            sequences.append(guesses + ([match] if match else []) + columns)
        tree, ends = trie(sequences, self.roots, spec.nodes, spec.depth, root.device)
        self.ends = torch.tensor([row[-window:] for row in ends], dtype=torch.long, device=root.device)
        self.drafted = tree
        return tree

    def verified(self, tree: Any, logits: torch.Tensor) -> None:
        """The verify's logits (B, n, V): the target's next token after each column, the window's
        next level (the argmax whether decoding samples or not: only proposals come of it)."""
        if tree is not self.drafted or self.ends is None:
            return  # a plain step's root-only tree
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        self.outputs = logits[rows, self.ends].argmax(-1)

    def end_step(self) -> None:
        self.drafted = None

    def select_rows(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()  # cost: a device read when rows leave (the lists live on the host)
        self.contexts = [self.contexts[i] for i in keep]
        self.levels = [self.levels[i] for i in keep]
        self.pools = [self.pools[i] for i in keep]

    def merge(self, other: LookaheadDrafter) -> None:
        self.contexts += other.contexts
        self.levels += other.levels
        self.pools += other.pools

    # ---- the window ----
    def _advance(self, row: int, outputs: list[int], accepted: int) -> None:
        """One Jacobi step of `row`'s window, its trajectories into the pool (module docstring)."""
        spec, levels = self.spec, self.levels[row]
        pool = self.pools[row]
        if spec.guesses:
            for f in range(spec.window):
                first = self.roots[row] if f == 0 else levels[0][f]
                tail = tuple(level[f] for level in levels[1:]) + (outputs[f],)
                kept = pool.setdefault(first, [])
                if tail not in kept:
                    kept.append(tail)
                    del kept[: -spec.guesses]  # at most G per first token, the newest
        levels = levels[1:] + [list(outputs)]
        shift = accepted - 1
        if shift:
            filler = self._fill(row, len(levels), min(shift, spec.window))
            levels = [level[shift:] + more for level, more in zip(levels, filler, strict=True)]
        self.levels[row] = levels

    def _fill(self, row: int, count: int, width: int) -> list[list[int]]:
        """`count` lists of `width` tokens drawn from the row's context (LADE's start), seeded by
        its length so that a run repeats."""
        context = self.contexts[row]
        pick = random.Random(len(context))
        return [[context[pick.randrange(len(context))] for _ in range(width)] for _ in range(count)]

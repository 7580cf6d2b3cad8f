"""What every drafter module shares: packing a head's linears, mapping draft-vocabulary logits to
the target vocabulary, stacking rows' visibility masks, what drafted nodes see of a step's entries."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart.targets.packing import PackedLinears


def packers(heads: Any) -> list[PackedLinears]:
    """Packers for the head and the target modules it borrows (a shared lm_head): a draft step
    over 4+ rows hits the same MKL cliff as the verify (an 8192-row draft lm_head: 1.1 ms for 1
    row, 2.8 for 4, 4.8 for 8; packed 1.4 and 1.9). None off CPU fp32."""
    bound = dict(getattr(heads, "_bound", {}))
    if isinstance(getattr(heads, "lm_head", None), nn.Module):
        # EAGLE-3 drafts with its own lm_head: packing the target's would only cost memory
        bound.pop("lm_head", None)
    modules = [heads, *bound.values()]
    found = (PackedLinears.for_model(m) for m in modules if isinstance(m, nn.Module))
    return [p for p in found if p is not None]


def in_target_vocab(logits: torch.Tensor, to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits (..., Vd) as target-vocabulary logits (..., V), -inf off the draft
    vocabulary (so sampling's q is exactly the distribution the drafts come from)."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return full.scatter(-1, to_target.expand_as(logits), logits)


def stack_visible(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Two (B, P) visibility masks stacked, the narrower left-padded with False (kv.stack_rows)."""
    width = max(mine.shape[1], theirs.shape[1])
    pad = [torch.cat([m.new_zeros(m.shape[0], width - m.shape[1]), m], dim=1) for m in (mine, theirs)]
    return torch.cat(pad)


def drafted_visibility(
    visible: torch.Tensor, nodes: torch.Tensor, entries: list[torch.Tensor]
) -> torch.Tensor:
    """(B, k, E): which of this step's drafted entries of a drafter's cache (`entries`, earlier frontiers in
    cache order, then `nodes` (B, k) themselves) each of `nodes` sees, from the tree's
    ancestor-or-self relation `visible` (B, N, N)."""
    width = nodes.shape[1]
    sees = visible[torch.arange(nodes.shape[0], device=nodes.device)[:, None], nodes]  # (B, k, N)
    return torch.cat([sees.gather(2, ids[:, None, :].expand(-1, width, -1)) for ids in [*entries, nodes]], -1)


def module_device(module: Any) -> torch.device:
    try:
        return next(module.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


class PerDepthLogits:
    """For drafters whose draft at a depth does not depend on the parent's token (Medusa's heads,
    DFlash's block): `observe` fills `_logits` (B, depth, V); the root's children are depth 0, and
    `expand` broadcasts a depth's logits to every frontier node."""

    _logits: torch.Tensor | None = None

    def root_logits(self) -> torch.Tensor:
        assert self._logits is not None, "observe() first"
        return self._logits[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Logits (B, k, V) of the children of `nodes` (B, k) at `depth` (they sit at depth + 1)."""
        assert self._logits is not None
        return self._logits[:, depth][:, None].expand(-1, nodes.shape[1], -1)


class PerDepthProgram(PerDepthLogits):
    """A per-depth drafter's `root_logits` and `expand` inside the round program
    (inference/captured_round.py), over the logits its last observe made (B, depth, V)."""

    max_depth = None

    def __init__(self, logits: torch.Tensor) -> None:
        self._logits = logits

"""Medusa's drafter: head k at the last committed feature drafts depth k (no cache), and its
compiled step (`--compile`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from headstart.inference.captured import allow_graphs, graph_mode, own, step_begins
from headstart.inference.drafters.common import (
    PerDepthLogits,
    PerDepthProgram,
    in_target_vocab,
    module_device,
    packers,
)
from headstart.targets.packing import packed


class MedusaDrafter(PerDepthLogits):
    """Medusa: head k at the last committed position's feature predicts the token at depth k;
    the draft does not depend on the parent's token, so `expand` only broadcasts."""

    def __init__(self, heads: Any, vocab_size: int | None = None, depth: int | None = None) -> None:
        self.heads = heads
        self.feature_layers: tuple[int, ...] = tuple(heads.feature_layers)
        self.max_depth: int | None = int(heads.num_heads)  # head k drafts depth k
        self.vocab_size = (
            vocab_size
            if vocab_size is not None
            else getattr(getattr(heads, "config", None), "vocab_size", None)
        )
        # Only the heads the tree reaches run: a chain of 1 needs head 1 alone (each head costs a
        # V x H projection per step).
        self.depth = self.max_depth if depth is None else max(1, min(depth, self.max_depth))
        self._logits: torch.Tensor | None = None  # (B, K, V): head k's logits at the last feature
        self.packers = packers(heads)
        # A draft vocabulary: project onto its Vd rows only (`in_target_vocab` maps back)
        self._to_target = (
            heads.draft_ids().to(module_device(heads)) if getattr(heads, "has_draft_vocab", False) else None
        )
        self.captured: Any = None  # a CapturedMedusa (decoder --compile)

    def capture(self, captured: Any, reserve: int) -> None:
        """Run the heads through `captured` (no cache: `reserve` is not needed)."""
        self.captured = captured

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        rows = torch.arange(last_hidden.shape[0], device=last.device)
        hidden = last_hidden[rows, last][:, None]  # (B, 1, H)
        draft_vocab = self._to_target is not None
        if self.captured is not None:  # --compile: one graph
            logits = self.captured(hidden, self.depth, draft_vocab)
        else:
            with torch.no_grad(), packed(self.packers, self.depth * hidden.shape[0]):  # the stacked lm_head
                if not draft_vocab:
                    logits = self.heads(hidden, self.depth)  # (K, B, 1, V)
                else:
                    logits = self.heads.draft_logits(hidden, self.depth)  # (K, B, 1, Vd)
        logits = logits[:, :, 0].transpose(0, 1)  # (B, K, V or Vd)
        if self._to_target is not None:
            logits = in_target_vocab(logits, self._to_target, self.vocab_size)
        self._logits = logits  # (B, K, V)

    def end_step(self) -> None:
        """Nothing drafted is cached by Medusa heads."""

    def select_rows(self, rows: torch.Tensor) -> None:
        if self._logits is not None:
            self._logits = self._logits[rows]

    def merge(self, other: MedusaDrafter) -> None:
        """Append `other`'s rows (requests joining a running batch)."""
        assert self._logits is not None and other._logits is not None
        self._logits = torch.cat([self._logits, other._logits])

    # ---- the captured round (inference/captured_round.py) ------------------------------------
    def round_inputs(self, plan: Any) -> MedusaInputs | None:
        """Its per-depth logits for the round program (None: the steps, where its heads are not
        captured or nothing was observed yet)."""
        if self.captured is None or self._logits is None:
            return None
        return MedusaInputs(self.captured.round_parts(self), (self._logits,))

    def round_done(self, logits: torch.Tensor, width: int) -> None:
        self._logits = logits

    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any:
        """Its heads as one graph (`--compile`), for headstart's own modules."""
        return CapturedMedusa(heads, backend=backend) if isinstance(heads, torch.nn.Module) else None


class CapturedMedusa:
    """Medusa's heads over the last committed feature (B, 1, H) -> (K, B, 1, V or Vd), compiled:
    no cache, one graph per (rows, depth)."""

    def __init__(self, heads: Any, backend: str = "inductor", mode: str | None = None) -> None:
        self.heads = heads
        mode = graph_mode(heads, mode)
        self.fn = _compiled_medusa(backend, mode)
        self._parts: dict[tuple[int, bool, int], MedusaParts] = {}
        self.steps = 0

    def round_parts(self, drafter: MedusaDrafter) -> MedusaParts:
        """The heads' share of the round program, one object per decoder and depth (the program
        is specialized on it)."""
        draft_vocab = drafter._to_target is not None
        key = (drafter.depth, draft_vocab, drafter.vocab_size)
        parts = self._parts.get(key)
        if parts is None:
            rows = self.heads.draft_rows(drafter.depth) if draft_vocab else None  # a Python cache: outside
            parts = self._parts[key] = MedusaParts(self.heads, drafter.depth, rows, drafter._to_target,
                                                   drafter.vocab_size)  # fmt: skip
        return parts

    def __call__(self, hidden: torch.Tensor, depth: int, draft_vocab: bool) -> torch.Tensor:
        rows = self.heads.draft_rows(depth) if draft_vocab else None  # outside: a Python cache
        step_begins(hidden.device)
        self.steps += 1
        return own(self.fn(self.heads, hidden.contiguous(), depth, rows))


def _medusa_graph(
    heads: Any, hidden: torch.Tensor, depth: int, rows: list[torch.Tensor] | None
) -> torch.Tensor:
    return heads.draft_logits(hidden, depth, rows=rows) if rows is not None else heads(hidden, depth)


@functools.cache
def _compiled_medusa(backend: str, mode: str | None) -> Any:
    allow_graphs()
    return torch.compile(_medusa_graph, fullgraph=True, backend=backend, mode=mode, dynamic=False)


@dataclass(frozen=True)
class MedusaInputs:
    parts: MedusaParts
    tensors: tuple[torch.Tensor]  # the per-depth logits (B, K, V) at the last committed feature


class MedusaParts:
    """Medusa's share of the round program: the tree's draft reads the per-depth logits, and the
    observe runs the heads at each row's last accepted feature (MedusaDrafter.observe's steps)."""

    def __init__(self, heads: Any, depth: int, rows: list[torch.Tensor] | None, to_target: torch.Tensor | None,
                 vocab: int) -> None:  # fmt: skip
        self.heads, self.depth, self.rows, self.to_target, self.vocab = heads, depth, rows, to_target, vocab

    def drafter(self, head: tuple[torch.Tensor]) -> PerDepthProgram:
        return PerDepthProgram(head[0])

    def round_observe(self, last: torch.Tensor, layers: dict[int, torch.Tensor], committed: torch.Tensor,
                      positions: torch.Tensor, real: torch.Tensor, last_index: torch.Tensor,
                      head: tuple[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        hidden = last.gather(1, last_index[:, None, None].expand(-1, 1, last.shape[-1]))  # (B, 1, H)
        logits = _medusa_graph(self.heads, hidden, self.depth, self.rows)[:, :, 0].transpose(0, 1)
        return in_target_vocab(logits, self.to_target, self.vocab) if self.to_target is not None else logits

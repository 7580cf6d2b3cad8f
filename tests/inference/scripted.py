"""A scripted drafter that knows each row's reference continuation: it drafts the true tokens
(with a wrong top-1 every `wrong_every` positions, so siblings and partial paths get exercised),
forcing long accepted paths through the decoder's KV compaction and batching code."""

from __future__ import annotations

from typing import Any

import torch


class ScriptedDrafter:
    feature_layers: tuple[int, ...] = ()
    max_depth = None

    def __init__(self, references: list[list[int]], vocab: int, wrong_every: int = 4) -> None:
        self.refs = references  # full sequences (prompt + reference continuation), unpadded
        self.vocab = vocab
        self.wrong_every = wrong_every
        self.rows: list[int] | None = None
        self.root_pos = torch.zeros(0, dtype=torch.long)

    def bind(self, target_model: Any) -> None:
        pass

    def _logits(self, offsets: torch.Tensor) -> torch.Tensor:
        """Logits (B, k, V) for the token at root_pos + offsets (B, k)."""
        out = torch.zeros(*offsets.shape, self.vocab)
        for b, row in enumerate(self.rows):
            for j, off in enumerate(offsets[b].tolist()):
                pos = int(self.root_pos[b]) + off
                ref = self.refs[row]
                truth = ref[pos] if pos < len(ref) else 3
                wrong = (truth + 1) % self.vocab
                out[b, j, truth] = 10.0
                if pos % self.wrong_every == 0:
                    out[b, j, wrong] = 11.0  # the truth is ranked second
        return out

    def observe(self, last_hidden, layers, next_tokens, positions, valid, last) -> None:
        if self.rows is None:
            self.rows = list(range(next_tokens.shape[0]))
        rows = torch.arange(next_tokens.shape[0])
        self.root_pos = positions[rows, last] + 1

    def root_logits(self) -> torch.Tensor:
        return self._logits(torch.ones(len(self.rows), 1, dtype=torch.long))[:, 0]

    def expand(self, nodes, parents, tokens, depth, visible) -> torch.Tensor:
        return self._logits(torch.full(nodes.shape, depth + 1, dtype=torch.long))

    def end_step(self) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in rows.tolist()]
        self.root_pos = self.root_pos[rows]

    def merge(self, other: Any) -> None:
        """A drafter object keeps its batch: the engine never merges one (a drafter given as an
        object is one generation's, not a server lane's)."""
        raise AssertionError("a scripted drafter is never merged")

"""Plain decoding as a drafter: every tree is the root alone."""

from __future__ import annotations

from typing import Any

import torch


class PlainDrafter:
    """No heads: every tree is the root alone, so a step is one token of plain decoding (or a
    prompt-lookup branch, `--tree +lookup:K`) through the same engine and verifier."""

    feature_layers: tuple[int, ...] = ()
    max_depth: int | None = 0

    def __init__(self) -> None:
        self.batch = 0

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        self.batch = next_tokens.shape[0]

    def root_logits(self) -> torch.Tensor:
        return torch.zeros(self.batch, 1)  # never ranked: the tree has no level to fill

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        raise AssertionError("a root-only tree has nothing to expand")

    def end_step(self) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        self.batch = int(rows.shape[0])

    def merge(self, other: PlainDrafter) -> None:
        self.batch += other.batch

    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any:
        """Nothing drafts: only the verify is compiled."""
        return None

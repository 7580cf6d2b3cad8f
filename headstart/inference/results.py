"""The decoder's typed state and what `generate` returns (tokens + stats)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DecodeState:
    """Live rows of a batch between steps. Finished rows leave (`select_rows`)."""

    cache: Any  # the target's DynamicCache: (B, kv_heads, P, D) per layer
    visible: torch.Tensor  # (B, P) bool: cache entries that are real (False: padding, short paths)
    lengths: torch.Tensor  # (B,) long: real tokens in the cache = position id of the root
    root: torch.Tensor  # (B,) long: the last committed token, not yet in the cache
    rows: list[int]  # original batch index of each live row

    def select_rows(self, keep: torch.Tensor, live: list[int] | None = None) -> None:
        """keep (B',) the live rows' indices on the device; `live` the same on the host (else
        read back from `keep`, a host sync)."""
        from headstart.inference.cache import select_rows

        select_rows(self.cache, keep)
        self.visible, self.lengths, self.root = self.visible[keep], self.lengths[keep], self.root[keep]
        self.rows = [self.rows[i] for i in (live if live is not None else keep.tolist())]


@dataclass
class DecodeStats:
    """tau = mean tokens committed per verify forward of a row, the bonus token INCLUDED
    (the prefill forward, which commits one token, is not counted in tau)."""

    batch_size: int = 1
    new_tokens: int = 0
    target_forwards: int = 0  # prefill + verify forwards (one batched forward counts once)
    row_steps: int = 0  # verify forwards summed over live rows
    committed: int = 0  # tokens committed by verify forwards, summed over rows
    wall_s: float = 0.0
    accept_lengths: Counter = field(default_factory=Counter)  # committed tokens per row-step -> count
    lossy: bool = False  # True when typical acceptance was used (output is NOT the target's)

    @property
    def tau(self) -> float:
        return self.committed / self.row_steps if self.row_steps else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "new_tokens": self.new_tokens,
            "tau": round(self.tau, 3),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "target_forwards": self.target_forwards,
            "batch_size": self.batch_size,
            "wall_s": round(self.wall_s, 3),
            "accept_length_histogram": {str(k): v for k, v in sorted(self.accept_lengths.items())},
        }
        if self.lossy:
            out["lossy"] = "typical acceptance: output is NOT distributed as the target's"
        return out


@dataclass
class GenerateOutput:
    token_ids: list[list[int]]  # the new tokens of each row (EOS included when it stopped the row)
    sequences: torch.Tensor  # (B, T + longest) prompt (as given) + new tokens, right padded with pad id
    stats: DecodeStats

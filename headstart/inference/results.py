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


POSITION_BUCKETS = ((256, "0-256"), (512, "256-512"), (1024, "512-1k"), (2048, "1k-2k"))
"""Context buckets of acceptance by position (upper bound, name); past the last: "2k+"."""


def position_bucket(position: int) -> str:
    """The bucket of a round whose root sits at `position` (the context's length before it)."""
    return next((name for bound, name in POSITION_BUCKETS if position < bound), "2k+")


def by_position_figures(counts: dict[str, list[int]]) -> dict[str, dict[str, float | int]]:
    """{bucket: {"rounds", "tau", "first_draft_rate"}} in bucket order, from [rounds, committed,
    accepted] counts (tau: tokens committed per round, bonus included)."""
    order = [name for _, name in POSITION_BUCKETS] + ["2k+"]
    return {
        name: {"rounds": counts[name][0], "tau": round(counts[name][1] / counts[name][0], 3),
               "first_draft_rate": round(counts[name][2] / counts[name][0], 3)}
        for name in order if name in counts and counts[name][0]
    }  # fmt: skip


@dataclass
class DecodeStats:
    """tau = mean tokens committed per verify forward of a row, the bonus token INCLUDED
    (the prefill forward, which commits one token, is not counted in tau)."""

    batch_size: int = 1
    new_tokens: int = 0
    target_forwards: int = 0  # prefill + verify forwards (one batched forward counts once)
    prefills: int = 1  # prefill forwards among them (prompts of unlike lengths prefill in groups)
    row_steps: int = 0  # verify forwards summed over live rows
    committed: int = 0  # tokens committed by verify forwards, summed over rows
    wall_s: float = 0.0
    accept_lengths: Counter = field(default_factory=Counter)  # committed tokens per row-step -> count
    lossy: bool = False  # True when typical acceptance was used (output is NOT the target's)
    per_row_tokens: list[int] = field(default_factory=list)  # new tokens of each prompt, in order
    per_row_steps: list[int] = field(default_factory=list)  # verify forwards each prompt took part in
    per_row_committed: list[int] = field(default_factory=list)  # tokens those forwards committed
    by_position: dict[str, list[int]] = field(default_factory=dict)
    """Per context bucket (POSITION_BUCKETS: where the round's root sat), [rounds, tokens the
    verify accepted (bonus included, before stops: as tau's accept lengths), rounds that accepted a
    draft]: where a head stops paying (bounded: five buckets)."""

    def __post_init__(self) -> None:
        for name in ("per_row_tokens", "per_row_steps", "per_row_committed"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.batch_size)

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

    def row_dict(self, row: int) -> dict[str, Any]:
        """One prompt's own figures in a batch (`as_dict` holds the batch's): its new tokens, its
        tau, its tokens over the batch's wall time, and the target forwards it took part in
        (prefill included)."""
        steps, tokens = self.per_row_steps[row], self.per_row_tokens[row]
        out: dict[str, Any] = {
            "new_tokens": tokens,
            "tau": round(self.per_row_committed[row] / steps, 3) if steps else 1.0,
            "tokens_per_s": round(tokens / self.wall_s, 2) if self.wall_s > 0 else 0.0,
            "target_forwards": steps + 1,
        }
        if self.lossy:
            out["lossy"] = "typical acceptance: output is NOT distributed as the target's"
        return out


@dataclass
class GenerateOutput:
    token_ids: list[list[int]]  # the new tokens of each row (EOS included when it stopped the row)
    sequences: torch.Tensor  # (B, T + longest) prompt (as given) + new tokens, right padded with pad id
    stats: DecodeStats

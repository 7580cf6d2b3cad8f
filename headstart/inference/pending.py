"""Committed positions a drafter has not observed yet.

A plain step (a batch too big to speculate, `Engine(speculate_up_to=...)`) drafts nothing, yet
each drafter used to observe its committed token at once: an EAGLE-3 head ran its layer over it,
a Medusa head its lm_heads, a DFlash head a whole block (measured at 8 rows on 2 cores: EAGLE-3
steps of 30-33 ms against 28-31 ms without heads). The engine keeps those positions here and
hands them to the drafter in ONE `observe` when it next drafts: the same positions in the same
order, so the drafter's cache and state end as they would have, at one forward's cost.
"""

from __future__ import annotations

import torch

Observation = tuple[
    torch.Tensor, dict[int, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]


class PendingObservations:
    """Stands in for the drafter at `commit` during plain steps (it takes `observe`'s arguments:
    target features (B, T, H), layer taps, the next tokens, positions, valid (B, T), last (B,))."""

    def __init__(self) -> None:
        self.items: list[Observation] = []

    def __len__(self) -> int:
        return len(self.items)

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        self.items.append((last_hidden, layers, next_tokens, positions, valid, last))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep `rows` of every waiting observation (rows leaving the batch)."""
        self.items = [
            (h[rows], {i: x[rows] for i, x in layers.items()}, t[rows], p[rows], v[rows], last[rows])
            for h, layers, t, p, v, last in self.items
        ]

    def clear(self) -> None:
        self.items = []

    def flush(self, drafter: object) -> None:
        """Feed every waiting position to `drafter` in one `observe`, oldest first; `last` is the
        newest observation's (the root the next draft starts from)."""
        if not self.items:
            return
        items, self.items = self.items, []
        widths = [item[2].shape[1] for item in items]
        layers = {i: torch.cat([item[1][i] for item in items], dim=1) for i in items[0][1]}
        drafter.observe(  # type: ignore[attr-defined]
            torch.cat([item[0] for item in items], dim=1),
            layers,
            torch.cat([item[2] for item in items], dim=1),
            torch.cat([item[3] for item in items], dim=1),
            torch.cat([item[4] for item in items], dim=1),
            items[-1][5] + (sum(widths) - widths[-1]),
        )

"""What the drafter has not observed yet, row group by row group.

A plain step (a batch too big to speculate, `Engine(speculate_up_to=...)`) drafts nothing, yet
each drafter used to observe its committed token at once: an EAGLE-3 head ran its layer over it,
a Medusa head its lm_heads, a DFlash head a whole block (measured at 8 rows on 2 cores: EAGLE-3
steps of 30-33 ms against 28-31 ms without heads). The engine keeps those positions here and
hands them to the drafter in ONE `observe` when it next drafts: the same positions in the same
order, so the drafter's cache and state end as they would have, at one forward's cost.

Requests that join while the batch steps plainly wait the same way, prompt included: their
prefill records what it would have fed a new drafter (`Deferred`), and the rows stay a group of
their own, with that drafter, until speculation resumes. Then each group's drafter observes its
rows' positions (the prompt first, as at a prefill) and the groups merge in row order into the
one drafter of the batch. A request that finishes before the batch speculates again never runs
the head at all: a server under load pays nothing for its heads (it paid each newcomer's prompt
through the head at its prefill and again at every join: 0.96x `--no-heads` at 8 clients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Observation = tuple[
    torch.Tensor, dict[int, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]


@dataclass
class Group:
    """Consecutive rows of the batch, the drafter that holds them, and what it has not seen."""

    drafter: Any
    rows: int
    items: list[Observation] = field(default_factory=list)
    # a deferred prefill: the drafter has seen nothing yet (its first item is the prompt), and
    # the first tokens it would have been handed at the prefill (drafters reading tokens)
    fresh: bool = False
    first: torch.Tensor | None = None
    waiting: int = 0
    """Positions waiting past the prompt (what bounds a group's wait), counted as plain steps add
    them (not summed over the items at every step)."""

    def feed(self) -> None:
        """Hand every waiting position to the drafter in one `observe` (after the deferred
        prefill's `start`, where the drafter reads tokens)."""
        if self.first is not None:
            self.drafter.start(self.first)
            self.first = None
        items, self.items = self.items, []
        self.fresh, self.waiting = False, 0
        if items:
            self.drafter.observe(*_joined(items))

    def select(self, local: list[int], device: torch.device) -> None:
        """Keep these of its rows (the others left the batch)."""
        index = torch.tensor(local, dtype=torch.long, device=device)
        if not self.fresh:  # a deferred prefill's drafter holds no rows yet
            self.drafter.select_rows(index)
        if self.first is not None:
            self.first = self.first[index]
        self.items = [_rows(item, index) for item in self.items]
        self.rows = len(local)


class Deferred:
    """Stands in for a newcomers' new drafter at their prefill, recording the prompt's
    observation (and `start`) instead of running the drafter; `group` then joins the pending."""

    def __init__(self, drafter: Any) -> None:
        self.group = Group(drafter, rows=0, fresh=True)

    def __getattr__(self, name: str) -> Any:  # feature_layers and the rest: the drafter's own
        return getattr(self.group.drafter, name)

    def start(self, first_tokens: torch.Tensor) -> None:
        if hasattr(self.group.drafter, "start"):
            self.group.first = first_tokens

    def observe(self, *observation: Any) -> None:
        self.group.items.append(observation)  # type: ignore[arg-type]
        self.group.rows = int(observation[2].shape[0])


class PendingObservations:
    """The batch's rows as groups in row order, each with its drafter and waiting observations.
    It stands in for the drafter at `commit` during plain steps (it takes `observe`'s arguments:
    target features (B, T, H), layer taps, the next tokens, positions, valid (B, T), last (B,))."""

    def __init__(self) -> None:
        self.groups: list[Group] = []

    @property
    def drafter(self) -> Any:
        """The first group's drafter: the batch's one once `flush` merged the groups."""
        return self.groups[0].drafter if self.groups else None

    @property
    def cold(self) -> bool:
        """Whether some rows' drafter has not seen their prompt yet (deferred joins)."""
        return any(g.fresh for g in self.groups)

    def start(self, drafter: Any, rows: int) -> None:
        """A new batch whose prefill fed its drafter."""
        self.groups = [Group(drafter, rows)]

    def join(self, group: Group) -> None:
        """Rows whose prefill was deferred stack under the others (a new batch: the first group)."""
        self.groups.append(group)

    def merge(self, drafter: Any, rows: int) -> Any:
        """Rows whose prefill fed `drafter` stack under the others: every group catches up first
        and merges (a drafter merges only between steps, whole); returns the batch's drafter."""
        main = self.flush()
        main.merge(drafter)
        self.groups[0].rows += rows
        return main

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        item = (last_hidden, layers, next_tokens, positions, valid, last)
        begin = 0
        for group in self.groups:  # views: each group holds its rows of the step's tensors
            rows = slice(begin, begin + group.rows)
            group.items.append(item if len(self.groups) == 1 else _rows(item, rows))
            group.waiting += next_tokens.shape[1]
            begin += group.rows

    def select_rows(self, keep: list[int], device: torch.device) -> None:
        """Keep these rows of the batch (ascending): each group keeps its own, and a group whose
        rows all left goes with its drafter. One group may take any rows, a row repeated too (the
        engine's ghosts: copies of a live row)."""
        if len(self.groups) == 1:
            if keep != list(range(self.groups[0].rows)):
                self.groups[0].select(keep, device)
            return
        groups, begin = [], 0
        for group in self.groups:
            local = [i - begin for i in keep if begin <= i < begin + group.rows]
            begin += group.rows
            if not local:
                continue
            if len(local) < group.rows:
                group.select(local, device)
            groups.append(group)
        self.groups = groups

    def clear(self) -> None:
        self.groups = []

    def feed_over(self, limit: int) -> None:
        """Feed the groups with more than `limit` positions waiting past their prompt: bounds what
        they hold (features per row and position) and the width of the one observe that feeds
        them (a head's mask is rows x width x cache). A fed group stays a group of its own."""
        for group in self.groups:
            if group.waiting >= limit:
                group.feed()

    def flush(self) -> Any:
        """Feed every group's waiting positions to its drafter in one `observe` each, oldest
        first, then merge the groups in row order; returns the batch's one drafter."""
        if not self.groups:
            return None
        for group in self.groups:
            group.feed()
        main, *rest = self.groups
        for group in rest:
            main.drafter.merge(group.drafter)
            main.rows += group.rows
        self.groups = [main]
        return main.drafter


def _rows(item: Observation, rows: torch.Tensor | slice) -> Observation:
    h, layers, t, p, v, last = item
    return h[rows], {i: x[rows] for i, x in layers.items()}, t[rows], p[rows], v[rows], last[rows]


def _joined(items: list[Observation]) -> Observation:
    """Observations of one group's rows as one, oldest first; `last` is the newest
    observation's (the root the next draft starts from), shifted past the earlier widths."""
    widths = [item[2].shape[1] for item in items]
    return (
        torch.cat([item[0] for item in items], dim=1),
        {i: torch.cat([item[1][i] for item in items], dim=1) for i in items[0][1]},
        torch.cat([item[2] for item in items], dim=1),
        torch.cat([item[3] for item in items], dim=1),
        torch.cat([item[4] for item in items], dim=1),
        items[-1][5] + (sum(widths) - widths[-1]),
    )

"""How newcomers' prompts are split into prefill forwards.

A prefill forward is padded to its longest prompt, so a group of one long and many short prompts
computes mostly padding (on the CPU, measured on 48 MT-bench first turns at batch 16: a greedy
cut by a token budget alone ran 3,888 padded tokens for 1,412 real ones). Each forward also has a
fixed cost (Python, kernel launches; on a GPU a small prefill is all launches). Over prompts
sorted by length, the split that minimises  sum over groups of (width x rows + overhead)  is a
small dynamic programme (n <= the batch: n^2 work, microseconds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def prefill_overhead_tokens(device: Any) -> int:
    """A prefill forward's fixed cost in prompt tokens' worth: on a 2-core CPU a token of SmolLM2's
    prefill is ~2.4 ms and a forward's fixed part ~30-80 ms; on a GPU a forward of a small model
    is launch-bound up to thousands of tokens (2026-11-25, H100: a 2,048-token prefill)."""
    return 32 if str(device).startswith("cpu") else 1024


def split_sorted(lengths: list[int], budget: int | None, overhead: int) -> list[int]:
    """Group sizes, in order, for prompts of these lengths (ascending): each group's padded
    tokens (its last length x its rows) within `budget` (a single prompt over it goes alone; None:
    no bound), and the sum of padded tokens plus `overhead` tokens per forward the least such a
    split gives."""
    if any(a > b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("split_sorted: lengths must be in ascending order")
    if budget is not None:
        return _split([(length, 1) for length in lengths], budget, overhead, lookback=len(lengths))
    # Unbounded, a split never cuts a run of equal lengths (moving a cut's equal-length rows into
    # the group on its left widens nothing): the programme runs over distinct lengths (12,000
    # equal prompts: one step, not 72 million), a group spanning at most 512 of them (a bound on
    # the work)
    runs: list[tuple[int, int]] = []  # (length, count)
    for length in lengths:
        if runs and runs[-1][0] == length:
            runs[-1] = (length, runs[-1][1] + 1)
        else:
            runs.append((length, 1))
    return _split(runs, None, overhead, lookback=512)


def _split(units: list[tuple[int, int]], budget: int | None, overhead: int, lookback: int) -> list[int]:
    """The dynamic programme over `units` (length, rows), ascending: group sizes in rows."""
    n = len(units)
    best = [0.0] + [float("inf")] * n  # best[i]: the cost of the first i units
    cut = [0] * (n + 1)  # cut[i]: where the last group of the first i units starts
    for end in range(1, n + 1):
        width, rows = units[end - 1][0], 0  # the group's widest: its last
        for start in range(end - 1, max(end - 1 - lookback, -1), -1):
            rows += units[start][1]
            if budget is not None and rows > 1 and width * rows > budget:
                break  # earlier starts only add rows
            cost = best[start] + width * rows + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    sizes: list[int] = []
    end = n
    while end:
        sizes.append(sum(count for _, count in units[cut[end] : end]))
        end = cut[end]
    return sizes[::-1]


def prefill_groups(
    items: Sequence[T], lengths: list[int], budget: int | None, overhead: int
) -> list[list[T]]:
    """`items` (sorted by their `lengths`, ascending) cut into the groups `split_sorted` picks."""
    groups, start = [], 0
    for size in split_sorted(lengths, budget, overhead):
        groups.append(list(items[start : start + size]))
        start += size
    return groups

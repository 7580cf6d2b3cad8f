"""The calibration's decision, from what it measured (no clock here: tests give it timings).

Two rules, both needed for a tree to be kept:
- the cost bound: a round commits tau tokens and costs at least its verify forward, which costs
  verify(n) / verify(1) plain steps (n: the tree's nodes, both timed here as their fastest of
  several repeats, which a busy machine can only slow); a tree whose measured tau does not beat
  that by MARGIN cannot pay, whatever the clock said (random heads: tau ~1.0). tau is counted,
  not timed: greedy decoding commits the same tokens on any machine at any load;
- the clock: decoded back to back with plain decoding prompt by prompt (pairs), the mean log
  speed ratio must beat log(1 + MARGIN) by more than SPREAD standard errors of its own pairs.
A tree the clock cannot place either way (within SPREAD s.e. of the margin) is `borderline`: the
verdict is plain decoding for now (it errs towards plain, never more than the noise slower), and a
later run measures again."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from headstart.inference.verify_cost import PAY_MARGIN as MARGIN  # beat plain by more than this share

SPREAD = 2.0
"""How many standard errors of its paired gap a tree's win (or loss) must clear."""
MIN_PAIRS = 3
"""Pairs a tree needs before the clock may judge it."""


@dataclass
class Run:
    """One greedy decode of one prompt: what it made and how long it took."""

    tokens: int
    wall_s: float
    committed: int = 0
    steps: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Measurement:
    """What a calibration measured: per candidate and for plain decoding, one Run per prompt
    (index i of every list: the same prompt, decoded back to back), the fastest verify forward
    by node count, and each candidate's verify nodes."""

    plain: list[Run] = field(default_factory=list)
    trees: dict[str, list[Run]] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)
    verify_ms: dict[int, float] = field(default_factory=dict)

    def tau(self, tree: str) -> float:
        runs = self.trees[tree]
        steps = sum(r.steps for r in runs)
        return sum(r.committed for r in runs) / steps if steps else 1.0

    def floor(self, tree: str) -> float:
        """The tau the tree must beat: its verify's cost in plain steps, with the margin
        (inference.verify_cost.tau_floor)."""
        from headstart.inference.verify_cost import tau_floor

        return tau_floor(self.verify_ms, self.nodes.get(tree, 1), MARGIN)

    def gap(self, tree: str) -> tuple[float, float, int]:
        """(mean log speed ratio tree / plain over the pairs, its standard error, pairs)."""
        logs = [math.log(t.rate / p.rate) for t, p in zip(self.trees[tree], self.plain, strict=False)
                if t.rate > 0 and p.rate > 0]  # fmt: skip
        if not logs:
            return 0.0, math.inf, 0
        mean = sum(logs) / len(logs)
        if len(logs) < 2:
            return mean, math.inf, 1
        var = sum((g - mean) ** 2 for g in logs) / (len(logs) - 1)
        return mean, math.sqrt(var / len(logs)), len(logs)


@dataclass
class Judgement:
    tree: str | None
    """The tree to decode with, or None: plain decoding."""
    reason: str
    """pays | bound | slower | borderline (a later run measures again)."""
    best: str | None
    """The tree closest to paying (for the note), None without candidates."""
    speedup: float
    """The best tree's measured speed over plain decoding (exp of its mean paired log ratio)."""
    gap_se: float | None
    pairs: int
    open: list[str]
    """Trees the clock has not placed yet (more pairs could decide them)."""


def within_bound(measured: Measurement) -> list[str]:
    """The candidates whose tau beats the cost of their verify (the others cannot pay)."""
    return [tree for tree in measured.trees if measured.tau(tree) > measured.floor(tree)]


def judge(measured: Measurement) -> Judgement:
    """The verdict on what was measured so far (see the module's rules)."""
    threshold = math.log(1 + MARGIN)
    possible = within_bound(measured)
    ranked = sorted(measured.trees, key=lambda tree: -measured.gap(tree)[0])
    if not possible:
        best = max(measured.trees, key=lambda tree: measured.tau(tree) / measured.floor(tree), default=None)
        return _verdict(measured, None, "bound", best, [])
    wins, open_ = [], []
    for tree in possible:
        gap, se, pairs = measured.gap(tree)
        if pairs >= MIN_PAIRS and gap - SPREAD * se > threshold:
            wins.append(tree)
        elif pairs < MIN_PAIRS or gap + SPREAD * se >= threshold:
            open_.append(tree)
    if wins:
        best = max(wins, key=lambda tree: measured.gap(tree)[0])
        return _verdict(measured, best, "pays", best, [])
    best = next(tree for tree in ranked if tree in possible)
    return _verdict(measured, None, "borderline" if open_ else "slower", best, open_)


def _verdict(
    measured: Measurement, tree: str | None, reason: str, best: str | None, open_: list[str]
) -> Judgement:
    gap, se, pairs = measured.gap(best) if best is not None else (0.0, math.inf, 0)
    return Judgement(tree=tree, reason=reason, best=best, speedup=math.exp(gap), pairs=pairs,
                     gap_se=se if math.isfinite(se) else None, open=open_)  # fmt: skip

"""The calibration's clock: what `judge` decides from, measured within a time budget.

1. The bound's costs: one verify forward of each candidate's node count and of 1 token, the
   fastest of REPEATS (a busy machine only slows a repeat, so the fastest is the machine's).
2. The screen: the first prompt decoded by every candidate and plainly, back to back. Its tau
   (counted, not timed) settles the bound; the fastest candidate within it goes on (LIVE).
3. Pairs: one prompt after another, plain decoding and the live candidates back to back (plain
   first on even prompts, last on odd ones), until `judge` places them, MAX_PAIRS are in, or the
   budget would be overrun by one more prompt. Cost: ~2 s a decode of 40 tokens for SmolLM2 on
   2 CPU cores; 8 decodes in the common case (4 in the screen, 2 more pairs), ~20 s in all."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from headstart.calibration.judge import Judgement, Measurement, Run, judge, within_bound

log = logging.getLogger(__name__)

NEW_TOKENS = 40
MAX_PAIRS = 8
LIVE = 1
"""Candidates that go on from the screen to the pairs (the fastest within the bound: close ones cost
little either way, and each one more costs a decode a pair)."""
REPEATS = 5
BUDGET_S = 30.0
"""The calibration's wall time (the screen always completes; pairs stop before they would pass it)."""


def measure(target: Any, decoders: dict[str, Any], plain: Any, prompts: list[list[int]],
            budget_s: float = BUDGET_S, clock: Callable[[], float] = time.monotonic) -> tuple[Measurement, Judgement, bool]:  # fmt: skip
    """(what was measured, its judgement, whether it finished within the budget) for `decoders`
    (candidate -> decoder of the same drafter) against `plain` on the token-id `prompts`."""
    from headstart.inference.plain import SamplingConfig

    start = clock()
    log.debug("calibration: start")
    measured = Measurement(nodes={name: int(getattr(d, "verify_nodes", 1)) for name, d in decoders.items()})
    measured.verify_ms = _verify_ms(target, {1, *measured.nodes.values()})
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    for decoder in [*decoders.values(), plain]:  # warm-up: packing and first-call costs out of the timings
        decoder.generate([prompts[0][:32]], sampling=SamplingConfig(max_new_tokens=8))
    log.debug("calibration: verify costs and warm-ups took %.1f s", clock() - start)
    measured.trees = {name: [] for name in decoders}
    with _keeping(decoders), tqdm(total=len(decoders) + 1, desc="calibrate", unit="run") as bar:
        _pair(measured, decoders, plain, list(decoders), prompts[0], sampling, 0, bar)
        live = sorted(within_bound(measured), key=lambda name: -measured.trees[name][0].rate)[:LIVE]
        measured.trees = {name: runs for name, runs in measured.trees.items() if name in live or not live}
        verdict, index = judge(measured), 1
        log.debug("calibration: the screen ended at %.1f s: %s", clock() - start, verdict)
        while verdict.reason == "borderline" and index < MAX_PAIRS:
            elapsed = clock() - start
            if (
                elapsed + elapsed / (len(measured.plain) + 1) * 1.5 > budget_s
            ):  # one more prompt would overrun
                return measured, verdict, False
            bar.total += len(verdict.open) + 1
            _pair(
                measured, decoders, plain, verdict.open, prompts[index % len(prompts)], sampling, index, bar
            )
            verdict, index = judge(measured), index + 1
    return measured, verdict, True


def _pair(measured: Measurement, decoders: dict[str, Any], plain: Any, names: list[str], prompt: list[int],
          sampling: Any, index: int, bar: Any) -> None:  # fmt: skip
    """One prompt decoded plainly and by each of `names`, back to back; a tree not decoded this
    time (set aside) gets no pair. Plain first on even prompts, last on odd ones."""
    order: list[str | None] = [*names]
    order = [None, *order] if index % 2 == 0 else [*order, None]
    for name in order:
        stats = (plain if name is None else decoders[name]).generate([prompt], sampling=sampling).stats
        run = Run(tokens=stats.new_tokens, wall_s=stats.wall_s)
        if name is None:
            measured.plain.append(run)
        else:
            run.committed, run.steps = stats.committed, stats.row_steps
            measured.trees[name].append(run)
        bar.update(1)
    for name in measured.trees:  # a tree set aside keeps its pairs aligned with plain's runs
        while len(measured.trees[name]) < len(measured.plain):
            measured.trees[name].append(Run(tokens=0, wall_s=0.0))


def _verify_ms(target: Any, nodes: set[int]) -> dict[int, float]:
    """The fastest of REPEATS verify forwards per node count (after a short cached context)."""
    from headstart.inference.verify_cost import verify_cost_ms

    return verify_cost_ms(target, sorted(nodes), context=64, repeats=REPEATS, pick=min)


def _keeping(decoders: dict[str, Any]) -> Any:
    """Every candidate's packed weights kept while measuring (a re-pack inside a timed run would
    charge ~0.4 s for SmolLM2 to it)."""
    from headstart.targets.mkl import MIN_ROWS, packed_rows

    probe = next(iter(decoders.values()))
    buckets = {
        packed_rows(d.verify_nodes) for d in decoders.values() if getattr(d, "verify_nodes", 0) >= MIN_ROWS
    }
    packer = getattr(probe, "packed", None)
    return packer.keeping(len(buckets)) if packer else contextlib.nullcontext()

"""Timing trees against each other and against plain decoding on THIS machine: the measurement
`headstart tune` and the first-use calibration (headstart/calibration.py) share. Candidates are
interleaved prompt by prompt, so the host's noise hits them alike; greedy output is identical for
every tree, so only speed differs."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from tqdm.auto import tqdm

from headstart.inference.verify_cost import PAY_MARGIN, tau_floor, verify_cost_ms

CALIBRATION_PROMPTS = (
    # Generic, not from any benchmark: the tuner must not be fitted on MT-bench or HumanEval.
    "Write a short email to a colleague asking to move our meeting to Friday.",
    "Explain how a refrigerator keeps food cold.",
    "List five tips for learning a new language.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are the main causes of inflation?",
    "Summarise the plot of a classic fairy tale in a few sentences.",
)


class LeanPlain:
    """headstart's leanest plain loop (inference.plain.cached_generate: its forward and kernels,
    no tree bookkeeping) with a decoder's `generate` face, the reference of the timing: the plain decoding a
    set-aside run gets, so the verdict compares the heads with what the user gets without them
    (the engine's own plain steps ran ~10% slower on 2026-11-28's CPU)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def generate(self, prompts: list[list[int]], sampling: Any = None) -> Any:
        from types import SimpleNamespace

        from headstart.inference.plain import cached_generate

        result = cached_generate(self.target, prompts[0], sampling)
        return SimpleNamespace(stats=SimpleNamespace(new_tokens=result.new_tokens, wall_s=result.wall_s))


def measure_trees(target: Any, decoders: dict[str, Any], prompts: list[str], max_new_tokens: int, prune: float,
                  plain: Any = None) -> dict[str, Any]:  # fmt: skip
    """The tuning report of `decoders` (tree text -> decoder of the same heads) on `prompts`, with
    `plain` (a decoder without heads) as the reference. Every candidate's packed weights are kept
    while measuring: a re-pack inside a timed run would charge ~0.4 s (SmolLM2) to it. Cost: one
    copy of the weights per distinct bucket, freed afterwards."""
    from headstart.targets.mkl import MIN_ROWS, packed_rows

    probe = next(iter(decoders.values()))
    buckets = {packed_rows(d.verify_nodes) for d in decoders.values() if d.verify_nodes >= MIN_ROWS}
    with probe.packed.keeping(len(buckets)) if probe.packed else contextlib.nullcontext():
        return _measure(target, decoders, list(decoders), prompts, max_new_tokens, prune, plain)


def _measure(
    target: Any,
    decoders: dict[str, Any],
    candidates: list[str],
    prompts: list[str],
    max_new_tokens: int,
    prune: float,
    plain: Any = None,
) -> dict[str, Any]:
    """Decode the calibration prompts with every candidate, interleaved; the tuning report. With
    `plain` (a decoder without heads), each prompt is also decoded plainly, never pruned: the
    report then says how the best tree compares with no speculation (`over_plain`)."""
    import torch

    from headstart.hardware import machine

    totals, reference = _decode_all(target, decoders, candidates, prompts, max_new_tokens, prune, plain)
    results, within_noise = _ranked(totals)
    nodes = {spec: int(getattr(decoder, "verify_nodes", 1)) for spec, decoder in decoders.items()}
    costs = verify_cost_ms(target, sorted({1, 2, 4, 8, 16, 32, 64} | set(nodes.values())))
    fastest = verify_cost_ms(target, sorted({1} | set(nodes.values())), context=64, pick=min)
    for row in results:  # the cost bound (calibration/judge.py): a tau at or below it cannot pay
        row["nodes"] = nodes[row["tree"]]
        row["floor"] = round(tau_floor(fastest, row["nodes"], PAY_MARGIN), 3)
    over_plain = None
    if plain is not None:
        gap, se = paired_gap(
            totals[results[0]["tree"]]["rates"], reference["rates"]
        )  # > 0: the best tree is faster
        over_plain = {
            "plain_tokens_per_s": reference["new_tokens"] / max(reference["wall_s"], 1e-9),
            "speedup": results[0]["tokens_per_s"] * reference["wall_s"] / max(reference["new_tokens"], 1),
            "gap": gap,
            "gap_se": se if math.isfinite(se) else None,
        }
    return {
        "tree": results[0]["tree"],
        "over_plain": over_plain,
        "within_noise": within_noise,
        "device": str(target.device),
        "machine": machine(str(target.device)),  # what a later run checks before trusting this tune
        "threads": torch.get_num_threads(),
        "dtype": str(target.dtype).removeprefix("torch."),
        "calibration_prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "candidates": results,
        "verify_cost_ms": {str(n): round(ms, 2) for n, ms in costs.items()},
    }


def _decode_all(target: Any, decoders: dict[str, Any], candidates: list[str], prompts: list[str],
                max_new_tokens: int, prune: float, plain: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Every prompt decoded by every live candidate (and plainly, when `plain`), interleaved;
    candidates far behind are pruned after the second prompt -> (per-candidate totals, plain's)."""
    from headstart.inference.plain import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    ids = [target.chat.user_prompt_ids(p) for p in prompts]
    for decoder in [*decoders.values(), *([plain] if plain is not None else [])]:  # warm-up
        decoder.generate([ids[0][:32]], sampling=SamplingConfig(max_new_tokens=8))
    reference: dict[str, Any] = {"new_tokens": 0, "wall_s": 0.0, "rates": []}
    totals = {
        spec: {"new_tokens": 0, "wall_s": 0.0, "committed": 0, "steps": 0, "prompts": 0, "rates": []}
        for spec in candidates
    }
    live = list(candidates)
    with tqdm(total=len(ids) * (len(candidates) + (plain is not None)), desc="tune", unit="run") as bar:
        for index, prompt in enumerate(ids):
            # plain decoding first on even prompts, last on odd ones: no position bias in the pairs
            order = ([None] if index % 2 == 0 else []) + live + ([None] if index % 2 else [])
            for spec in order if plain is not None else live:
                stats = (
                    (plain if spec is None else decoders[spec]).generate([prompt], sampling=sampling).stats
                )
                row = reference if spec is None else totals[spec]
                row["new_tokens"] += stats.new_tokens
                row["wall_s"] += stats.wall_s
                row["rates"].append(stats.new_tokens / max(stats.wall_s, 1e-9))
                if spec is not None:
                    row["committed"] += stats.committed
                    row["steps"] += stats.row_steps
                    row["prompts"] += 1
                bar.update(1)
            if index >= 1:
                kept = _survivors(live, totals, prune)
                bar.total -= (len(live) - len(kept)) * (len(ids) - index - 1)
                live = kept
    return totals, reference


def _ranked(totals: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The candidates fastest first (those that ran every prompt before pruned ones), each behind
    the best by a paired gap; and the trees within two standard errors of the best."""
    results = sorted(
        (
            {
                "tree": spec,
                "tokens_per_s": row["new_tokens"] / row["wall_s"],
                "tau": row["committed"] / max(1, row["steps"]),
                "prompts": row["prompts"],
            }
            for spec, row in totals.items()
        ),
        key=lambda r: (-r["prompts"], -r["tokens_per_s"]),  # candidates that ran every prompt first
    )
    best_rates = totals[results[0]["tree"]]["rates"]
    within_noise = []
    for result in results[1:]:
        gap, se = paired_gap(best_rates, totals[result["tree"]]["rates"])
        result["behind"], result["behind_se"] = gap, (se if math.isfinite(se) else None)  # None: 1 prompt
        if not math.isfinite(se) or gap <= 2 * se:
            within_noise.append(result["tree"])
    return results, within_noise


def paired_gap(best: list[float], other: list[float]) -> tuple[float, float]:
    """How far `other` runs behind `best`, paired prompt by prompt (both ran each prompt back to
    back, so a slow spell of the host hits both): the mean per-prompt log speed ratio and its
    standard error. A gap under ~2 standard errors is this machine's noise, not a real difference
    (on the shared 2-core CPU, trees within ~10% swapped places between 6-prompt tunes)."""
    gaps = [math.log(b / o) for b, o in zip(best, other, strict=False) if b > 0 and o > 0]  # 0: no tokens
    if len(gaps) < 2:
        return (gaps[0] if gaps else 0.0), math.inf
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
    return mean, math.sqrt(var / len(gaps))


def _survivors(live: list[str], totals: dict[str, dict[str, Any]], prune: float) -> list[str]:
    """The candidates within `prune` x the best running tokens/s (the 3 best always stay)."""
    speed = {spec: totals[spec]["new_tokens"] / max(totals[spec]["wall_s"], 1e-9) for spec in live}
    ranked = sorted(live, key=lambda spec: -speed[spec])
    best = speed[ranked[0]]
    return [spec for i, spec in enumerate(ranked) if i < 3 or speed[spec] >= prune * best]

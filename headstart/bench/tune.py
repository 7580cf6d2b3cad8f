"""Pick the tree that decodes fastest on THIS hardware, and store it with the heads.

A tree good on an H100 is far too big for a 2-core CPU (a 64-token verify costs ~4x a 1-token
one here). The tuner measures rather than guesses: it times the target's verify forward against
the number of nodes (for the record and the report), then decodes a calibration set with every
candidate tree, interleaved prompt by prompt so machine noise hits all candidates alike, and keeps
the tree with the highest measured tokens/s. Greedy output is identical for every tree, so only
speed differs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

CALIBRATION_PROMPTS = (
    # Generic, not from any benchmark: the tuner must not be fitted on MT-bench or HumanEval.
    "Write a short email to a colleague asking to move our meeting to Friday.",
    "Explain how a refrigerator keeps food cold.",
    "List five tips for learning a new language.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are the main causes of inflation?",
    "Summarise the plot of a classic fairy tale in a few sentences.",
)


def forked(depth: int, forks: int) -> str:
    """A chain of `depth` top-1 drafts plus the runner-up at each of its first `forks` levels, as a
    --tree JSON value: a CPU-sized tree (depth + forks nodes) that recovers the commonest miss."""
    paths = [[0] * d for d in range(1, depth + 1)] + [[0] * d + [1] for d in range(forks)]
    return json.dumps(paths, separators=(",", ":"))


def candidate_trees(kind: str, max_depth: int | None) -> list[str]:
    """Chains and small forked trees sized for CPUs up to mid-size trees for accelerators.

    max_depth: how deep the heads can draft (Medusa: its number of heads; None for EAGLE heads,
    which draft autoregressively to any depth: chains then go up to 6)."""
    deepest = min(max_depth or 6, 8)  # a DFlash block drafts 15: deeper chains rarely pay on a CPU
    chains = [f"chain:{d}" for d in range(1, deepest + 1)]
    forks = [forked(d, f) for d in range(2, min(deepest, 5) + 1) for f in (1, 2) if f < d]
    # a prompt-lookup branch beside the small trees: verified in the same forward, it pays where
    # the output copies from the context (code, quotes, lists)
    looked = [f"{base}+lookup:{k}" for base in ("chain:1", "chain:2", forked(2, 1)) for k in (2, 4)]
    if kind == "medusa":
        return chains + forks + looked + ["static"]
    dynamic = [
        f"dynamic:depth={d},top_k={k},total_tokens={n}"
        for d, k, n in ((3, 2, 4), (4, 2, 6), (4, 4, 8), (5, 4, 10), (6, 4, 12), (6, 8, 24), (8, 8, 48))
    ]
    if kind == "dflash":  # one block drafts every depth at once: deeper trees cost no extra draft pass
        dynamic += [f"dynamic:depth={d},top_k={k},total_tokens={n}" for d, k, n in ((8, 2, 12), (10, 4, 20))]
    # small dynamic trees with a lookup branch: exact under sampling too (unlike static + lookup)
    looked += [f"{dynamic[i]}+lookup:4" for i in (0, 1)]
    return chains + forks + looked + dynamic


def tune(
    target: Any,
    heads_path: str | Path,
    prompts: list[str],
    max_new_tokens: int = 128,
    candidates: list[str] | None = None,
    prune: float = 0.7,
) -> dict[str, Any]:
    """Measure every candidate tree on `prompts`; return the tuning report (best first).

    Successive pruning: after each prompt from the second on, a candidate below `prune` x the
    best running tokens/s is dropped (at least 3 stay), so a long candidate list costs about as
    much as a few good ones. Dropped candidates are reported with the prompts they ran.

    max_new_tokens: measure at the length you decode. A lookup branch pays more the longer a reply
    runs, so short calibration replies undersell it (64 tokens picked `chain:2` for the shipped
    EAGLE-3 heads: MT-bench tau 1.62; 128 picked `[[0],[0,0],[1]]+lookup:4`: tau 2.22)."""
    from headstart.speculator import load_speculator
    from headstart.target.mkl import MIN_ROWS, packed_rows

    speculator = load_speculator(target, heads_path, "static")  # loaded once; every candidate's tree below
    probe = speculator.decoder
    candidates = candidates or candidate_trees(speculator.heads.kind, probe.max_depth)
    decoders = {spec: speculator.new_decoder(tree=spec) for spec in candidates}
    # keep every candidate's packs while tuning: a re-pack inside a timed run would charge ~0.4 s
    # (SmolLM2) to it. Cost: one copy of the weights per distinct bucket, freed afterwards.
    buckets = {packed_rows(d.verify_nodes) for d in decoders.values() if d.verify_nodes >= MIN_ROWS}
    # plain decoding (no drafts) runs every prompt too: whether the heads pay at all on this hardware
    plain = load_speculator(target, plain=True).decoder
    with probe.packed.keeping(len(buckets)) if probe.packed else contextlib.nullcontext():
        return _measure(target, decoders, candidates, prompts, max_new_tokens, prune, plain)


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

    from headstart.bench.cost import verify_cost_ms
    from headstart.calibration import machine
    from headstart.inference.plain import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    ids = [target.chat.user_prompt_ids(p) for p in prompts]
    for decoder in [*decoders.values(), *([plain] if plain is not None else [])]:  # warm-up
        decoder.generate([ids[0][:32]], sampling=SamplingConfig(max_new_tokens=8))
    reference = {"new_tokens": 0, "wall_s": 0.0, "rates": []}
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
                if spec is None:
                    stats = plain.generate([prompt], sampling=sampling).stats
                    reference["new_tokens"] += stats.new_tokens
                    reference["wall_s"] += stats.wall_s
                    reference["rates"].append(stats.new_tokens / max(stats.wall_s, 1e-9))
                    bar.update(1)
                    continue
                stats = decoders[spec].generate([prompt], sampling=sampling).stats
                row = totals[spec]
                row["new_tokens"] += stats.new_tokens
                row["wall_s"] += stats.wall_s
                row["committed"] += stats.committed
                row["steps"] += stats.row_steps
                row["prompts"] += 1
                row["rates"].append(stats.new_tokens / max(stats.wall_s, 1e-9))
                bar.update(1)
            if index >= 1:
                kept = _survivors(live, totals, prune)
                bar.total -= (len(live) - len(kept)) * (len(ids) - index - 1)
                live = kept
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
    over_plain = None
    if plain is not None:
        gap, se = paired_gap(best_rates, reference["rates"])  # > 0: the best tree is faster
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
        "verify_cost_ms": {str(n): round(ms, 2) for n, ms in verify_cost_ms(target).items()},
    }


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

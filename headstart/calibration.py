"""Speculation only where it pays: on a machine its heads were not tuned on, the first decode with
them measures, in a few seconds, whether any small tree beats plain decoding HERE, and decodes
plainly when none does (`--speculate always` forces the heads; an explicit `--tree` skips it).

Why: the tree `headstart tune` stores travels with the heads, the machine it was tuned on does
not. On a 2-core AVX-512 CPU without AMX the shipped EAGLE-3 heads ran at 0.86-0.91x of
headstart's own plain decoding with the tree tuned elsewhere; the user got a slower default than
the engine already had. The verdict is cached per machine (CPU model and ISA, or GPU name),
thread count, target and heads, under the user's cache folder: the second run measures nothing.

What it measures: plain decoding (the lean loop a set-aside run decodes with) and a handful of trees (the stored one, chains of 1 and 2, one
forked tree) on CALIBRATION prompts, interleaved prompt by prompt (headstart.inference.timing), greedy,
a short reply each. A tree is used only when it beats plain decoding by more than MARGIN: the
verdict errs towards plain decoding, never more than the noise slower than it.
cost: ~15-25 s on the 2-core CPU for SmolLM2 (3 prompts x 5 methods x 48 tokens, warm-ups
included), once per machine, thread count, target and heads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from headstart.hardware import machine

log = logging.getLogger(__name__)

MARGIN = 0.03
"""A tree must beat plain decoding by more than this share to be used."""
PROMPTS = 3
NEW_TOKENS = 48


def cache_dir() -> Path:
    """`$HEADSTART_CALIBRATION_CACHE`, else the cache folder's `calibration/`."""
    import os

    from headstart.targets.gguf import cache_root

    given = os.environ.get("HEADSTART_CALIBRATION_CACHE")
    return Path(given).expanduser() if given else cache_root() / "calibration"


def cache_file(target: Any, heads_path: Path, device: str, threads: int) -> Path:
    """Where the verdict for this machine, thread count, target and heads is kept."""

    weights = heads_path / "model.safetensors"
    stamp = f"{weights.stat().st_size}:{weights.stat().st_mtime_ns}" if weights.is_file() else ""
    ident = json.dumps([machine(device), threads, getattr(target, "fingerprint", {}) or getattr(target, "spec", ""),
                        str(heads_path.resolve()), stamp], sort_keys=True, default=str)  # fmt: skip
    return cache_dir() / (hashlib.sha256(ident.encode()).hexdigest()[:20] + ".json")


def stored_tune_fits(stored: dict[str, Any] | None, device: str, threads: int) -> bool:
    """Whether `headstart tune`'s stored report was measured on this machine at this thread count
    (then its verdict stands and nothing is measured)."""
    if not stored:
        return False
    return stored.get("machine") == machine(device) and stored.get("threads") == threads


def verdict_of(report: dict[str, Any]) -> str | None:
    """The tree a tuning report says to decode with, or None for plain decoding (no tree beat
    plain decoding by more than MARGIN; a report without a plain comparison keeps its tree)."""
    over = report.get("over_plain")
    if over is None:
        return report["tree"]
    return report["tree"] if over["speedup"] > 1 + MARGIN else None


def calibrate(target: Any, heads: Any, stored_tree: str | None, greedy: bool) -> dict[str, Any]:
    """Measure plain decoding against a few trees of `heads` here; the verdict (cached by the caller)."""
    import torch

    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.timing import CALIBRATION_PROMPTS, LeanPlain, measure_trees

    candidates = list(
        dict.fromkeys([*([stored_tree] if stored_tree else []), "chain:1", "chain:2", "[[0],[0,0],[1]]"])
    )
    if not greedy:  # sampling: a static tree's lookup branch cannot be verified exactly
        candidates = [c for c in candidates if "+lookup" not in c] or ["chain:1"]
    log.warning(
        "calibrating once for this machine (%s, %d threads): do these heads beat plain decoding here? "
        "(~20 s; --speculate always skips it)",
        machine(str(target.device)), torch.get_num_threads(),
    )  # fmt: skip
    started = time.perf_counter()
    decoders = {spec: SpeculativeDecoder(target, heads, tree=spec) for spec in candidates}
    plain = LeanPlain(target)
    report = measure_trees(target, decoders, list(CALIBRATION_PROMPTS[:PROMPTS]), NEW_TOKENS, 0.0, plain)
    tree = verdict_of(report)
    return {
        "tree": tree,
        "speedup": round(report["over_plain"]["speedup"], 3),
        "best_tree": report["tree"],
        "machine": machine(str(target.device)),
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - started, 1),
        "candidates": [{k: r[k] for k in ("tree", "tokens_per_s", "tau")} for r in report["candidates"]],
        "plain_tokens_per_s": report["over_plain"]["plain_tokens_per_s"],
    }


def decide(target: Any, heads: Any, heads_path: Path, stored: dict[str, Any] | None, greedy: bool
           ) -> tuple[str | None, str]:  # fmt: skip
    """(the tree to decode with, or None for plain decoding; a one-line note saying why)."""
    import torch

    from headstart.io import atomic_write_text

    device, threads = str(target.device), torch.get_num_threads()
    if stored_tune_fits(stored, device, threads):
        tree = verdict_of(stored)  # type: ignore[arg-type]
        return tree, "" if tree else "the heads' tuned report says no tree beats plain decoding here"
    path = cache_file(target, heads_path, device, threads)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict) or "tree" not in found:
        found = calibrate(target, heads, (stored or {}).get("tree"), greedy)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(found, indent=1) + "\n")
        except OSError as err:  # a read-only cache: decide now, measure again next time
            log.warning("warning: cannot keep the calibration in %s (%s)", path, err.strerror or err)
    if found["tree"] is None:
        return None, (
            f"the heads do not pay on this machine (best tree {found['best_tree']}: {found['speedup']:.2f}x plain "
            f"decoding, measured {found['seconds']} s): decoding plainly; --speculate always uses them anyway"
        )
    return found["tree"], ""

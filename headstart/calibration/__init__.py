"""Speculation only where it pays: on a machine its drafts (heads, or a `--draft-model`) were not
tuned on, the first decode with them measures whether any small tree beats plain decoding HERE,
and decodes plainly when none does (`--speculate always` forces them; an explicit `--tree` skips it).

Why: the tree `headstart tune` stores travels with the heads, the machine it was tuned on does
not. On a 2-core AVX-512 CPU without AMX the shipped EAGLE-3 heads ran at 0.86-0.91x of
headstart's own plain decoding with the tree tuned elsewhere; the user got a slower default than
the engine already had. The verdict is cached per machine (CPU model and ISA, or GPU name),
thread count, target and drafts, under the user's cache folder: the second run measures nothing.

What decides (calibration/judge.py): a tree is used only when its counted tau beats the measured
cost of its verify (random heads never do, whatever the clock says) AND, decoded back to back with
plain decoding prompt by prompt, it beats plain decoding by more than MARGIN plus SPREAD standard
errors of its own pairs. What the clock cannot place is `borderline`: plain decoding for now, and
the next run measures again (at most MAX_CALIBRATIONS times). The measurement keeps to a budget
(calibration/measure.py, BUDGET_S); one that runs out of it decodes plainly, says so, and is retried.
cost: ~15-25 s on the 2-core CPU for SmolLM2, once per machine, thread count, target and drafts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from headstart.calibration.judge import MARGIN, SPREAD
from headstart.hardware import machine

log = logging.getLogger(__name__)

VERSION = 2
"""Verdicts of another version are measured again (version 1 decided from one wall-clock
comparison, which a busy machine could fool into keeping random heads)."""
MAX_CALIBRATIONS = 3
"""A borderline (or cut short) verdict is measured again at most this many times in all."""
PROMPTS = 6
REASONS = ("pays", "bound", "slower", "borderline", "budget")
UNSETTLED = ("borderline", "budget")


@dataclass
class Verdict:
    """The cached verdict (one JSON file per machine, thread count, target and drafts)."""

    version: int
    tree: str | None
    """The candidate to decode with, None for plain decoding."""
    reason: str
    """pays | bound (its tau cannot pay for its verify) | slower | borderline | budget (cut short)."""
    best_tree: str | None
    speedup: float
    """The best candidate's speed over plain decoding, from its pairs."""
    seconds: float
    calibrations: int = 1
    margin: float = MARGIN
    spread: float = SPREAD
    """The win a tree needed: more than `margin`, by `spread` standard errors of its pairs."""
    pairs: int = 0
    gap_se: float | None = None
    tau: float = 1.0
    floor: float = 1.0
    """The best candidate's counted tau and the tau its verify's cost asked of it."""
    machine: str = ""
    threads: int = 0
    candidates: list[dict[str, Any]] = field(default_factory=list)
    plain_tokens_per_s: float = 0.0

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise ValueError(f"a verdict of version {self.version}, not {VERSION} (an older headstart's)")
        if self.reason not in REASONS:
            raise ValueError(f"'reason' is {self.reason!r}, not one of {', '.join(REASONS)}")
        if (self.tree is not None) != (self.reason == "pays"):
            raise ValueError(f"'tree' is {self.tree!r} where 'reason' is {self.reason!r}")
        if not (
            math.isfinite(self.speedup) and self.speedup > 0 and self.seconds >= 0 and self.calibrations >= 1
        ):
            raise ValueError("'speedup', 'seconds' or 'calibrations' out of range")


def cache_dir() -> Path:
    """`$HEADSTART_CALIBRATION_CACHE`, else the cache folder's `calibration/`."""
    import os

    from headstart.targets.gguf import cache_root

    given = os.environ.get("HEADSTART_CALIBRATION_CACHE")
    return Path(given).expanduser() if given else cache_root() / "calibration"


def drafts_ident(path: Path | None, spec: str = "") -> str:
    """What names the drafts in the cache key: a folder by its resolved path and its weights'
    size and time (retrained heads are measured again), a drafter by its spec."""
    if path is None:
        given = Path(spec).expanduser()
        path = given if given.exists() else None
        if path is None:
            return spec
    weights = path / "model.safetensors"
    stamp = f"{weights.stat().st_size}:{weights.stat().st_mtime_ns}" if weights.is_file() else ""
    return f"{path.resolve()}:{stamp}"


def cache_file(target: Any, ident: str, device: str, threads: int) -> Path:
    """Where the verdict for this machine, thread count, target and drafts (`drafts_ident`) is kept."""
    key = json.dumps([machine(device), threads, getattr(target, "fingerprint", {}) or getattr(target, "spec", ""),
                      ident], sort_keys=True, default=str)  # fmt: skip
    return cache_dir() / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


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
    if not isinstance(over, dict) or not isinstance(over.get("speedup"), int | float):
        return report["tree"]
    return report["tree"] if over["speedup"] > 1 + MARGIN else None


def decide(target: Any, ident: str, candidates: list[str], build: Callable[[str], Any],
           stored: dict[str, Any] | None, what: str = "the heads") -> tuple[str | None, str]:  # fmt: skip
    """(the candidate to decode with, or None for plain decoding; a one-line note saying why).
    `candidates`: what may be measured (tree texts, or a drafter's specs), `build(name)` its
    decoder; `stored`: `headstart tune`'s report (trusted when measured here); `what` names the
    drafts in the note."""
    import torch

    device, threads = str(target.device), torch.get_num_threads()
    if stored_tune_fits(stored, device, threads):
        tree = verdict_of(stored)  # type: ignore[arg-type]
        return tree, "" if tree else f"the tuned report of {what} says no tree beats plain decoding here"
    path = cache_file(target, ident, device, threads)
    found = cached(path, candidates)
    if found is None or (found.reason in UNSETTLED and found.calibrations < MAX_CALIBRATIONS):
        verdict = calibrate(target, candidates, build, what)
        verdict.calibrations = (found.calibrations + 1) if found is not None else 1
        keep(path, verdict)
        found = verdict
    return found.tree, note(found, what)


def cached(path: Path, candidates: list[str]) -> Verdict | None:
    """The verdict kept at `path`, or None to measure again: absent, damaged (said once, then
    replaced), of an older version, or naming a candidate no longer measured."""
    from headstart.records import DamagedFile, read_record

    if not path.is_file():
        return None
    try:
        found = read_record(path, Verdict, fix="")
    except DamagedFile as err:
        log.warning(f"warning: the calibration kept in {path} is damaged ({err.why}): measuring again")
        return None
    if found.tree is not None and found.tree not in candidates:
        log.warning(
            f"warning: the calibration kept in {path} names {found.tree}, not a candidate now: measuring again"
        )
        return None
    return found


def keep(path: Path, verdict: Verdict) -> None:
    from headstart.io import atomic_write_text

    try:
        atomic_write_text(path, json.dumps(asdict(verdict), indent=1) + "\n")
    except OSError as err:  # a read-only cache: decide now, measure again next time
        log.warning("warning: cannot keep the calibration in %s (%s)", path, err.strerror or err)


def calibrate(
    target: Any, candidates: list[str], build: Callable[[str], Any], what: str = "the heads"
) -> Verdict:
    """Measure plain decoding against the candidates here (calibration/measure.py) and judge."""
    import torch

    from headstart.calibration.measure import BUDGET_S, measure
    from headstart.inference.timing import CALIBRATION_PROMPTS, LeanPlain

    log.warning(
        "calibrating once for this machine (%s, %d threads): do %s beat plain decoding here? "
        "(~20 s, at most %.0f s; --speculate always skips it)",
        machine(str(target.device)), torch.get_num_threads(), what, BUDGET_S,
    )  # fmt: skip
    started = time.perf_counter()
    decoders = {name: build(name) for name in candidates}
    prompts = [target.chat.user_prompt_ids(p) for p in CALIBRATION_PROMPTS[:PROMPTS]]
    measured, judged, finished = measure(target, decoders, LeanPlain(target), prompts)
    best = judged.best
    return Verdict(
        version=VERSION, tree=judged.tree, reason=judged.reason if finished else "budget",
        best_tree=best, speedup=round(judged.speedup, 3), seconds=round(time.perf_counter() - started, 1),
        pairs=judged.pairs, gap_se=None if judged.gap_se is None else round(judged.gap_se, 4),
        tau=round(measured.tau(best), 3) if best else 1.0, floor=round(measured.floor(best), 3) if best else 1.0,
        machine=machine(str(target.device)), threads=torch.get_num_threads(),
        candidates=[{"tree": name, "tau": round(measured.tau(name), 3), "floor": round(measured.floor(name), 3),
                     "nodes": measured.nodes[name], "pairs": measured.gap(name)[2],
                     "speedup": round(math.exp(measured.gap(name)[0]), 3)} for name in measured.trees],
        plain_tokens_per_s=round(sum(r.tokens for r in measured.plain) / max(1e-9, sum(r.wall_s for r in measured.plain)), 2),
    )  # fmt: skip


def note(verdict: Verdict, what: str = "the heads") -> str:
    """Why plain decoding was chosen, in one line ('' when a tree pays)."""
    tail = f"measured {verdict.seconds} s): decoding plainly; --speculate always uses them anyway"
    if verdict.reason == "pays":
        return ""
    if verdict.reason == "bound":
        return (f"{what} do not pay on this machine (best tree {verdict.best_tree} commits {verdict.tau:.2f} "
                f"tokens a round where its verify alone costs {verdict.floor / (1 + MARGIN):.2f} plain steps, {tail}")  # fmt: skip
    if verdict.reason == "slower":
        return (f"{what} do not pay on this machine (best tree {verdict.best_tree}: {verdict.speedup:.2f}x plain "
                f"decoding over {verdict.pairs} paired prompts, {tail}")  # fmt: skip
    again = (
        "the next run measures again" if verdict.calibrations < MAX_CALIBRATIONS else "measured enough times"
    )
    if verdict.reason == "budget":
        return (f"the calibration of {what} ran out of its budget ({verdict.seconds} s: is the machine busy?) "
                f"before it could tell whether they pay: decoding plainly; {again}")  # fmt: skip
    se = f" +- {verdict.gap_se:.3f}" if verdict.gap_se is not None else ""
    return (f"{what} may not pay on this machine (best tree {verdict.best_tree}: {verdict.speedup:.2f}x plain "
            f"decoding{se}, within the noise of the {MARGIN:.0%} margin): decoding plainly; {again}")  # fmt: skip

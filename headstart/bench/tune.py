"""Pick the tree that decodes fastest on THIS hardware, and store it with the heads.

A tree good on an H100 is far too big for a 2-core CPU (a 64-token verify costs ~4x a 1-token
one here). The tuner measures rather than guesses: it times the target's verify forward against
the number of nodes (for the record and the report), then decodes a calibration set with every
candidate tree, interleaved prompt by prompt so machine noise hits all candidates alike, and keeps
the tree with the highest measured tokens/s. Greedy output is identical for every tree, so only
speed differs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from headstart import kinds
from headstart.inference.timing import CALIBRATION_PROMPTS, LeanPlain, _survivors, measure_trees, paired_gap  # noqa: F401

log = logging.getLogger(__name__)


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
    from headstart import kinds

    trees = kinds.get(kind).trees if kind in kinds.KINDS else "dynamic"  # a drafter object: autoregressive
    if trees == "static":
        return chains + forks + looked + ["static"]
    dynamic = [
        f"dynamic:depth={d},top_k={k},total_tokens={n}"
        for d, k, n in ((3, 2, 4), (4, 2, 6), (4, 4, 8), (5, 4, 10), (6, 4, 12), (6, 8, 24), (8, 8, 48))
    ]
    if trees == "block":  # one block drafts every depth at once: deeper trees cost no extra draft pass
        dynamic += [f"dynamic:depth={d},top_k={k},total_tokens={n}" for d, k, n in ((8, 2, 12), (10, 4, 20))]
    # small dynamic trees with a lookup branch: exact under sampling too (unlike static + lookup)
    looked += [f"{dynamic[i]}+lookup:4" for i in (0, 1)]
    return chains + forks + looked + dynamic


def calibration_prompts(path: str | None, limit: int) -> list[str]:
    """The first turns of `limit` questions of the JSONL file at `path`, or of the built-in
    calibration prompts (one line when `limit` asks for more than there are)."""
    from headstart.bench.questions import load_questions
    from headstart.errors import HeadstartError

    if path:
        return [q.turns[0] for q in load_questions(path, limit=limit)]
    if limit > len(CALIBRATION_PROMPTS):
        raise HeadstartError(
            f"--limit {limit}: there are {len(CALIBRATION_PROMPTS)} built-in calibration prompts",
            "pass --prompts FILE (e.g. MT-bench's question.jsonl) for more",
        )
    return list(CALIBRATION_PROMPTS[:limit])


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

    speculator = load_speculator(target, heads_path, "static")  # loaded once; every candidate's tree below
    candidates = candidates or candidate_trees(speculator.heads.kind, speculator.decoder.max_depth)
    decoders = {spec: speculator.new_decoder(tree=spec) for spec in candidates}
    # plain decoding (headstart's lean loop, no drafts) runs every prompt too: whether the heads pay
    # at all on this hardware, against the plain decoding a run without them gets
    plain = LeanPlain(target)
    return measure_trees(target, decoders, prompts, max_new_tokens, prune, plain)


DRAFT_TREES = (
    "chain:1",
    "chain:2",
    "chain:3",
    "chain:4",
    "chain:5",
    "dynamic:depth=3,top_k=2,total_tokens=4",
)
"""What a draft model's tune tries: one draft forward per level, so chains and one small tree."""


def draft_candidates(target: Any, draft: str) -> list[str]:
    """The draft models a tune of `draft` compares: a registered drafter's bare name its own
    candidates (early exit's layers, Lookahead's sizes: headstart.kinds.DraftKind.candidates);
    anything else is itself."""
    kind = kinds.draft_kind(draft)
    if kind is not None and draft.strip() == kind.name:
        return list(kinds.load(kind.candidates)(target))
    return [draft]


def tune_draft(target: Any, draft: str, prompts: list[str], max_new_tokens: int = 128,
               candidates: list[str] | None = None, prune: float = 0.7) -> dict[str, Any]:  # fmt: skip
    """Measure a draft model's trees (and, for a registered drafter's bare name, its candidates) on
    `prompts` against plain decoding; the report's `tree` names the best as "DRAFT TREE", its
    `draft` and `draft_tree` the two parts (what `--draft-model DRAFT` then decodes with)."""
    from headstart.speculator import load_speculator

    trees = candidates or list(DRAFT_TREES)
    decoders, parts = {}, {}  # candidate name -> decoder, and -> (draft, tree)
    for spec in draft_candidates(target, draft):
        kind = kinds.draft_kind(spec)
        if kind is not None and kind.own_tree:  # its specs are the candidates (--candidates unused)
            decoders[spec], parts[spec] = load_speculator(target, draft_model=spec).decoder, (spec, "")
            continue
        speculator = load_speculator(target, tree=trees[0], draft_model=spec)  # loaded once per draft
        for tree in trees:
            decoders[f"{spec} {tree}"], parts[f"{spec} {tree}"] = (
                speculator.new_decoder(tree=tree),
                (spec, tree),
            )
    report = measure_trees(target, decoders, prompts, max_new_tokens, prune, LeanPlain(target))
    best, tree = parts[report["tree"]]
    return report | {"draft": best, "draft_tree": tree, "asked": draft.strip()}


def conclude(report: dict[str, Any], heads: str | None, dry_run: bool, target: Any = None) -> None:
    """`headstart tune`'s table and verdict on stdout; the best tree stored with `heads` unless
    `dry_run`, or unless it is slower than plain decoding (a stored tree is what generate and serve
    decode with). A draft model's tune (heads None) is stored in the user's cache for `target` and
    the draft even then: the user asked for that draft, and is told plain decoding is faster."""
    import math

    from headstart.tuned import draft_tune_file, save_draft_tune, save_tuned, tuned_file

    def kept_file() -> Path:
        return tuned_file(heads) if heads is not None else draft_tune_file(target, report["asked"])

    def store() -> Path:
        return (
            save_tuned(report, heads)
            if heads is not None
            else save_draft_tune(report, target, report["asked"])
        )

    print(f"{'tree':<44} {'tokens/s':>9} {'tau':>6}  behind the best (paired, +- 1 s.e.)")
    for row in report["candidates"]:
        gap = ""
        if "behind" in row:  # the stored gap is a mean log ratio: as a share of the best's speed
            slower = 1 - math.exp(-row["behind"])
            se = (
                "?"
                if row["behind_se"] is None
                else f"{100 * math.exp(-row['behind']) * row['behind_se']:.1f}%"
            )
            gap = f"{100 * slower:5.1f}% +- {se}"
        print(f"{row['tree']:<44} {row['tokens_per_s']:>9.2f} {row['tau']:>6.2f}  {gap}")
    print("verify forward ms by nodes:", report["verify_cost_ms"])
    plain = report.get("over_plain")
    if plain:
        print(
            f"plain decoding (no drafts, same prompts, interleaved): {plain['plain_tokens_per_s']:.2f} tokens/s; "
            f"the best tree runs at {plain['speedup']:.2f}x of it"
        )
        se = plain["gap_se"]
        if se is not None and plain["gap"] < -2 * se:
            drafter = (
                "these heads cost more than they save"
                if heads is not None
                else "this draft costs more than it saves"
            )
            print(
                f"note: on this hardware {drafter}: serve with --no-heads "
                "(headstart's plain decoding; `generate --no-heads` is transformers' slower generate), or "
                "train heads that accept more (a verify of k nodes costs the times printed above)"
            )
    if report["within_noise"]:
        print(
            f"note: {', '.join(report['within_noise'])} ran within this machine's noise of the best "
            f"(paired per-prompt gap under 2 standard errors over {report['calibration_prompts']} prompts); "
            "more calibration prompts (--prompts FILE --limit N) or a quieter machine would separate them"
        )
    best = report["candidates"][0]
    bound = best["tau"] <= best.get("floor", 0.0)  # its tau cannot pay for its verify, whatever the clock
    if dry_run:
        print(f"best: {report['tree']} (not stored: --dry-run)")
    elif heads is not None and (bound or (plain and plain["speedup"] < 1.0)):
        # a stored tree is what generate and serve decode with
        kept = kept_file()
        print(
            f"best: {report['tree']} {_why_not(best, plain, bound)}: not stored "
            + (f"({kept} is kept as it was)" if kept.is_file() else "(no tree stored)")
            + "; decode with --no-heads on this hardware, or train heads that accept more"
        )
    else:
        slower = (
            f" (at {plain['speedup']:.2f}x plain decoding: --no-heads is faster here)"
            if plain and plain["speedup"] < 1.0
            else ""
        )
        print(f"best: {report['tree']} -> stored in {store()}{slower}")


def _why_not(best: dict[str, Any], plain: dict[str, Any] | None, bound: bool) -> str:
    """Why the best tree is not stored, in words: the cost bound, or plain decoding is faster."""
    from headstart.inference.verify_cost import PAY_MARGIN

    if bound:
        return (f"commits {best['tau']:.2f} tokens a round where its verify alone costs "
                f"{best['floor'] / (1 + PAY_MARGIN):.2f} plain steps")  # fmt: skip
    return f"runs at {plain['speedup']:.2f}x plain decoding"  # type: ignore[index]

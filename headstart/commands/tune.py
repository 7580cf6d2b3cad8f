"""`headstart tune`: choose the fastest tree for these heads on this hardware; store it with them."""

from __future__ import annotations

import argparse

from headstart.commands.common import add_target_arguments, load_target_from_args
from headstart.errors import HeadstartError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--heads", required=True, help="trained heads directory (the tuned tree is written there)"
    )
    parser.add_argument(
        "--prompts", default=None, help="calibration questions (JSONL); default: built-in generic prompts"
    )
    parser.add_argument("--limit", type=int, default=6, help="calibration prompts to use")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=128,
        help="tokens per calibration reply; keep it at what you decode (bench and generate: 128)",
    )
    parser.add_argument("--candidates", default=None, help="--tree values to try, separated by ';'")
    parser.add_argument("--dry-run", action="store_true", help="measure and print, do not store")


def run(args: argparse.Namespace) -> int:
    import math
    from pathlib import Path

    from headstart.bench.questions import load_questions
    from headstart.bench.tune import CALIBRATION_PROMPTS, tune
    from headstart.heads.resolve import resolve_heads
    from headstart.outputs import check_writable
    from headstart.tuned import save_tuned, tuned_file

    args.heads = str(resolve_heads(args.heads))  # a Hub id is downloaded once, as generate does
    if not (Path(args.heads) / "config.json").is_file():
        raise HeadstartError(
            f"no trained heads at {args.heads}", "pass the directory written by headstart train"
        )
    if args.candidates is not None and not [c for c in args.candidates.split(";") if c.strip()]:
        raise HeadstartError(
            "--candidates names no tree", "e.g. --candidates 'chain:2;chain:3', or leave it out"
        )
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise HeadstartError(f"{flag} must be >= 1, got {value}", f"use e.g. {flag} 6")
    if not args.prompts and args.limit > len(CALIBRATION_PROMPTS):
        raise HeadstartError(
            f"--limit {args.limit}: there are {len(CALIBRATION_PROMPTS)} built-in calibration prompts",
            "pass --prompts FILE (e.g. MT-bench's question.jsonl) for more",
        )
    if not args.dry_run:  # where the tuned tree goes: fail now, not after minutes of measuring
        check_writable(tuned_file(args.heads).parent, "tuned tree's directory")
    prompts = (
        [q.turns[0] for q in load_questions(args.prompts, limit=args.limit)]
        if args.prompts
        else list(CALIBRATION_PROMPTS[: args.limit])
    )
    target = load_target_from_args(args)
    candidates = [c.strip() for c in args.candidates.split(";") if c.strip()] if args.candidates else None
    report = tune(target, args.heads, prompts, max_new_tokens=args.max_new_tokens, candidates=candidates)
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
            print(
                "note: on this hardware these heads cost more than they save: serve with --no-heads "
                "(headstart's plain decoding; `generate --no-heads` is transformers' slower generate), or "
                "train heads that accept more (a verify of k nodes costs the times printed above)"
            )
    if report["within_noise"]:
        print(
            f"note: {', '.join(report['within_noise'])} ran within this machine's noise of the best "
            f"(paired per-prompt gap under 2 standard errors over {report['calibration_prompts']} prompts); "
            "more calibration prompts (--prompts FILE --limit N) or a quieter machine would separate them"
        )
    if args.dry_run:
        print(f"best: {report['tree']} (not stored: --dry-run)")
    elif plain and plain["speedup"] < 1.0:  # a stored tree is what generate and serve decode with
        kept = tuned_file(args.heads)
        print(
            f"best: {report['tree']} runs at {plain['speedup']:.2f}x plain decoding: not stored "
            + (f"({kept} is kept as it was)" if kept.is_file() else "(no tree stored)")
            + "; decode with --no-heads on this hardware, or train heads that accept more"
        )
    else:
        print(f"best: {report['tree']} -> stored in {save_tuned(report, args.heads)}")
    return 0

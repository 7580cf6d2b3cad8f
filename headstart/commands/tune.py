"""`headstart tune`: choose the fastest tree for these heads on this hardware; store it with them.
With --draft-model: a draft model's tree (and, for `early-exit`, its exit layer), kept in the
user's cache for that target and draft."""

from __future__ import annotations

import argparse

from headstart.commands.common import add_target_arguments, load_target_from_args
from headstart.errors import HeadstartError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--heads", help="trained heads directory (the tuned tree is written there)")
    which.add_argument(
        "--draft-model",
        dest="draft",
        help="a draft model (as generate takes it) to tune instead: its tree, and for `early-exit` (no K) "
        "the exit layer; kept in the user's cache, read by --draft-model without --tree",
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
    from pathlib import Path

    from headstart.bench.tune import calibration_prompts, conclude, tune, tune_draft
    from headstart.heads.resolve import resolve_heads
    from headstart.outputs import check_writable
    from headstart.tuned import tuned_file

    if args.heads is not None:
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
    if not args.dry_run and args.heads is not None:  # where the tree goes: fail now, not after minutes
        check_writable(tuned_file(args.heads).parent, "tuned tree's directory")
    prompts = calibration_prompts(args.prompts, args.limit)
    target = load_target_from_args(args)
    candidates = [c.strip() for c in args.candidates.split(";") if c.strip()] if args.candidates else None
    if args.draft is not None:
        report = tune_draft(
            target, args.draft, prompts, max_new_tokens=args.max_new_tokens, candidates=candidates
        )
    else:
        report = tune(target, args.heads, prompts, max_new_tokens=args.max_new_tokens, candidates=candidates)
    conclude(report, args.heads, dry_run=args.dry_run, target=target)
    return 0

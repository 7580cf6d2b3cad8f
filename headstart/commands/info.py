"""`headstart info`: what the target is, how long it took to load, and its forward latency."""

from __future__ import annotations

import argparse
import json
from typing import Any

from headstart.commands.common import add_target_arguments, load_target_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--context", type=int, default=128, help="KV context for the latency measurement")


def check_context(context: int, target: Any = None) -> None:
    """--context must be >= 1 and leave room for the measured tokens in the target's context
    (checked before the load for the sign, after it for the length: a 100k-token prefill on a
    CPU runs for many minutes before failing)."""
    from headstart.errors import HeadstartError
    from headstart.targets.latency import REPEATS

    if context < 1:
        raise HeadstartError(f"--context must be >= 1, got {context}", "use e.g. --context 128")
    limit = getattr(target.config, "max_position_embeddings", None) if target is not None else None
    if limit and context + REPEATS > limit:
        raise HeadstartError(
            f"--context {context} + {REPEATS} measured tokens exceeds the target's context of {limit}",
            f"use --context {limit - REPEATS} or less",
        )


def run(args: argparse.Namespace) -> int:
    from headstart.targets.info import describe

    check_context(args.context)
    target = load_target_from_args(args)
    check_context(args.context, target)
    info = describe(target, args.context)
    if args.json:
        print(json.dumps(info))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "parameters":
            value = f"{value:,} ({value / 1e6:.1f} M)"
        print(f"{key:<{width}}  {value}")
    return 0

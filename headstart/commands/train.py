"""`headstart train --recipe recipes/FILE.yaml [dotted.overrides] [--resume] [--dry-run]`.

Runs the same under `accelerate launch ... -m headstart train ...` for several processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipe", required=True, help="a YAML TrainConfig, e.g. recipes/smollm2-medusa-cpu.yaml"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. max_steps=100 head.num_heads=4")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in output_dir"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the recipe (and --accelerate-config) and print the plan; loads no model or data",
    )
    parser.add_argument(
        "--accelerate-config", default=None, help="with --dry-run: an accelerate config file to validate"
    )
    parser.add_argument(
        "--time-budget",
        type=duration,
        default=None,
        metavar="DURATION",
        help="stop cleanly (a checkpoint for --resume) before this much wall time, start-up included: "
        "540, 540s, 9m or 1.5h",
    )


def duration(text: str) -> float:
    """'540', '540s', '9m', '1.5h' -> seconds (argparse reports a ValueError as a bad value)."""
    import math

    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    text = text.strip().lower()
    scale = units.get(text[-1:], None)
    value = float(text[:-1] if scale else text) * (scale or 1.0)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


def run(args: argparse.Namespace) -> int:
    from headstart.config import load_config
    from headstart.errors import HeadstartError
    from headstart.train.config import TrainConfig

    if args.accelerate_config and not args.dry_run:
        raise HeadstartError(
            "--accelerate-config only goes with --dry-run (it checks a config; it does not launch)",
            f"accelerate launch --config_file {args.accelerate_config} -m headstart train --recipe {args.recipe}",
        )
    if args.dry_run and args.time_budget:
        raise HeadstartError("--dry-run trains nothing: --time-budget would be ignored", "drop --time-budget")

    budget = [f"time_budget_s={args.time_budget}"] if args.time_budget else []
    cfg = load_config(TrainConfig, args.recipe, [*args.overrides, *budget])  # misspelt keys fail here
    if args.dry_run:
        from headstart.train.dryrun import dry_run, refusals

        plan = dry_run(cfg, args.accelerate_config, resume=args.resume)
        print(json.dumps(plan, indent=2))
        if plan["cannot_run_here"]:  # this machine's, not the recipe's: it may run elsewhere
            print(f"warning: this machine lacks {'; '.join(plan['cannot_run_here'])}", file=sys.stderr)
        refused = refusals(plan)
        if refused is not None:
            raise refused
        return 0
    from headstart.train.loop import train

    # stdout carries the JSON summary only: whatever the libraries print while training
    # (deepspeed's and accelerate's notices, tracker banners) goes to stderr instead
    with contextlib.redirect_stdout(sys.stderr):
        summary = train(cfg, resume=args.resume, command=_command(args))
    if summary.get("final"):
        keep = ("steps", "wall_s", "tokens_per_s", "peak_rss_mb", "processes", "final")
        print(json.dumps({k: summary[k] for k in keep} | {"final_eval": summary["final_eval"]}, indent=2))
    elif summary.get("stopped"):
        keep = ("steps", "wall_s", "tokens_per_s", "processes", "stopped", "checkpoint")
        print(json.dumps({k: summary[k] for k in keep}, indent=2))
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command line that rebuilds the run (the recipe as given, relative to the working dir)."""
    import shlex

    return shlex.join(["headstart", "train", "--recipe", args.recipe, *args.overrides])

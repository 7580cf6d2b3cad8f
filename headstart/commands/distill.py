"""`headstart distill`: the target's own replies to prompts (or to prompts it writes itself)."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

# CLI flag dest -> DistillConfig field; flags left at None do not override the recipe.
FLAGS: dict[str, tuple[type, str]] = {
    "target": (str, "Hub id, local model directory, .gguf file, or 'smollm2'"),
    "dtype": (str, "float32, bfloat16, float16 or auto"),
    "device": (str, "cpu, cuda, cuda:N or auto"),
    "revision": (str, "Hub revision of the target"),
    "threads": (int, "CPU threads for torch (0 = default; 1 is fastest on a CPU shared with other jobs)"),
    "prompts": (
        str,
        "prompt file (.json/.jsonl/.parquet[.gz]), dataset dir or Hub dataset; omit for data-free",
    ),
    "split": (str, "dataset split (dataset dirs and Hub names)"),
    "shape": (str, "auto, sharegpt, messages, alpaca, mtbench, prompt or text"),
    "field": (str, "column holding the prompt or conversation (e.g. question)"),
    "system": (str, "system message for every conversation (default: the template's)"),
    "out": (str, "output directory (rerun the same command to resume)"),
    "skip_rows": (int, "start at this source row (more data without repeating an earlier run)"),
    "num": (int, "records wanted in the output (default 1000)"),
    "max_turns": (int, "answer at most this many user turns per conversation (0 = all)"),
    "followups": (int, "then let the target write this many more user turns and answer them (default 0)"),
    "documents": (
        int,
        "long-document tasks: the target first writes a document of up to N tokens on each first turn, "
        "then the turn is that document and a task about it (default 0: off)",
    ),
    "max_new_tokens": (int, "longest reply per turn (default 256)"),
    "temperature": (float, "0 = greedy replies (default)"),
    "top_p": (float, "nucleus sampling for replies"),
    "top_k": (int, "top-k sampling for replies (0 = off)"),
    "seed": (int, "sampling seed (default 0)"),
    "engine": (
        str,
        "headstart (continuous batching on headstart's forward, default), generate (transformers), "
        "dataset (the data's own replies) or openai (an OpenAI-compatible server: --base-url, --model)",
    ),
    "base_url": (str, "--engine openai: the server's API root, e.g. http://localhost:8000/v1"),
    "model": (str, "--engine openai: the model name the server serves the target under"),
    "concurrency": (int, "--engine openai: requests in flight (default 8)"),
    "batch_size": (int, "conversations in flight at once (default 64)"),
    "max_prompt_tokens": (int, "skip rows whose prompt is longer (default 1024)"),
    "min_prompt_tokens": (int, "skip rows whose first prompt is shorter: a long-context set (default 0)"),
    "shard_size": (int, "records per shard (default 256)"),
    "feature_layers": (str, "with --cache-features: ids like 1,14,25, 'eagle3' or 'last' (default eagle3)"),
    "feature_dtype": (str, "float16 or bfloat16"),
    "max_feature_gb": (float, "refuse to start if the feature cache is estimated larger (default 20)"),
}


log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", default=None, help="YAML recipe (flags and overrides win over it)")
    for dest, (kind, help_text) in FLAGS.items():
        parser.add_argument("--" + dest.replace("_", "-"), dest=dest, type=kind, default=None, help=help_text)
    parser.add_argument(
        "--cache-features",
        dest="cache_features",
        action="store_true",
        default=None,
        help="also store hidden states per record",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. datafree.temperature=0.9")


def config_from_args(args: argparse.Namespace) -> Any:
    from headstart.config import load_config
    from headstart.distill.config import DistillConfig

    flags = [
        f"{dest}={json.dumps(getattr(args, dest))}"
        for dest in (*FLAGS, "cache_features")
        if getattr(args, dest) is not None
    ]
    return load_config(DistillConfig, args.recipe, [*flags, *args.overrides])


def run(args: argparse.Namespace) -> int:
    from headstart.commands.common import quiet_transformers
    from headstart.distill.pipeline import run_distill

    cfg = config_from_args(args)
    with quiet_transformers():
        summary = run_distill(cfg, quiet=args.quiet)
    if args.json:
        print(json.dumps(summary))
        return 0
    lines = {
        "records": f"{summary['records_total']} in {cfg.out} ({summary['records_written']} new)",
        "tokens": f"{summary['tokens']} total, {summary['generated_tokens']} generated",
        "replies": f"{summary['replies']} (mean {summary['mean_reply_tokens']} tokens, {summary['truncated_replies']} hit --max-new-tokens)",
        "throughput": f"{summary['replies_per_min']} replies/min, {summary['generated_tokens_per_s']} generated tokens/s",
        "wall time": f"{summary['wall_s']} s (generation {summary['generation_s']} s)",
        "skipped rows": ", ".join(f"{k}: {v}" for k, v in summary["skipped"].items()) or "none",
    }
    if summary["datafree_prompts"]:
        df = summary["datafree_prompts"]
        lines["data-free prompts"] = (
            f"{df['accepted']} kept of {df['sampled']} sampled ({df['rejection_rate']:.0%} rejected: {df['rejected']})"
        )
    if summary["source_exhausted"]:
        lines["note"] = "the prompt source ran out before --num usable rows"
    for key, value in lines.items():
        log.info(f"{key:>17}: {value}")
    return 0

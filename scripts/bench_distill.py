"""Distillation throughput: `headstart distill` with its default engine (continuous batching on
headstart's forward) against the same command with transformers' `generate` at batch 1, on the
same prompts, in one run, greedy.

    .venv/bin/python scripts/bench_distill.py --prompts ../shared/data/train/ShareGPT_V3_filtered_1000.json \
        --num 128 --baseline-num 16 --max-new-tokens 128 --batch-size 128

Both runs go through `run_distill` (the real pipeline: chat template, records, shards) into a
temporary directory, first turns only. Prints each run's generated tokens/s (reply loop only, the
target load excluded), the ratio, and how many of the baseline's replies the batched run wrote
identically (batching pads and reorders attention reductions, so a greedy reply can differ at a
near-tie). `--baseline-num K` runs `generate` on the first K prompts only (it is ~10x slower);
tokens/s does not depend on the count.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2")
    parser.add_argument(
        "--prompts", required=True, help="a prompt file distill reads (ShareGPT, messages, ...)"
    )
    parser.add_argument("--num", type=int, default=128)
    parser.add_argument(
        "--baseline-num", type=int, default=16, help="prompts run through generate at batch 1"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="float32", help="the target's dtype in both runs")
    parser.add_argument(
        "--generate-batch", type=int, default=0,
        help="also time generate at this batch size on all --num prompts (the distill engine before continuous batching)",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    from headstart.distill import DistillConfig, load_distilled
    from headstart.distill.pipeline import run_distill
    from headstart.targets import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    runs, records = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        plan = [("headstart", "headstart", args.batch_size, args.num)]
        if args.generate_batch:
            plan.append((f"generate_batch{args.generate_batch}", "generate", args.generate_batch, args.num))
        plan.append(("generate_batch1", "generate", 1, args.baseline_num))
        for name, engine, batch, num in plan:
            cfg = DistillConfig(
                out=str(Path(tmp) / name), target=args.target, prompts=args.prompts, num=num, max_turns=1,
                max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                engine=engine, batch_size=batch, device=args.device, dtype=args.dtype,
            )  # fmt: skip
            runs[name] = run_distill(cfg, target=target, quiet=False)
            records[name] = {r["index"]: r["input_ids"] for r in load_distilled(cfg.out)}
    same = sum(records["headstart"].get(i) == ids for i, ids in records["generate_batch1"].items())
    fast, base = runs["headstart"], runs["generate_batch1"]
    keys = ("records_written", "generated_tokens", "generation_s", "generated_tokens_per_s")
    result = {
        "target": args.target,
        "threads": torch.get_num_threads(),
        "device": str(target.device),
        "dtype": str(target.dtype),
        "max_new_tokens": args.max_new_tokens,
        **{name: {k: run[k] for k in keys} for name, run in runs.items()},
        "ratio": round(fast["generated_tokens_per_s"] / base["generated_tokens_per_s"], 2),
        "identical_records": f"{same}/{len(records['generate_batch1'])}",
        "batch_size": args.batch_size,
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Distillation throughput: transformers' `generate` at batch 1 against headstart's continuous
batching (the `headstart distill` engine), on the same prompts, in one run, greedy.

    .venv/bin/python scripts/bench_distill.py --prompts ../shared/data/train/ShareGPT_V3_filtered_1000.json \
        --num 32 --max-new-tokens 128 --batch-size 32

Prints new tokens/s of each, the ratio, and how many replies are identical (continuous batching
pads and reorders attention reductions, so a reply can differ from batch-1 `generate` at a near-tie;
the count says how often). `--baseline-num K` times `generate` on the first K prompts only (it is
~10x slower); the ratio compares tokens/s, which does not depend on the count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def first_turns(path: str, num: int, max_prompt_tokens: int, target) -> list[list[int]]:  # noqa: ANN001
    from headstart.distill.shapes import Skip, to_conversation
    from headstart.distill.sources import BadRow, read_rows

    prompts = []
    for _, row in read_rows(path):
        if isinstance(row, BadRow):
            continue
        conv = to_conversation(row)
        if isinstance(conv, Skip):
            continue
        ids = target.chat.prompt_ids([{"role": "user", "content": conv.turns[0]}])
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == num:
            break
    return prompts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2")
    parser.add_argument(
        "--prompts", required=True, help="a prompt file distill reads (ShareGPT, messages, ...)"
    )
    parser.add_argument("--num", type=int, default=32)
    parser.add_argument("--baseline-num", type=int, default=0, help="prompts timed with generate (0 = all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from headstart.distill.replies import Sampling, generate_batch
    from headstart.inference.continuous import ContinuousBatcher, Request
    from headstart.inference.plain import SamplingConfig
    from headstart.target import load_target

    target = load_target(args.target)
    prompts = first_turns(args.prompts, args.num, args.max_prompt_tokens, target)
    base_prompts = prompts[: args.baseline_num or None]
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, threads {torch.get_num_threads()}",
          file=sys.stderr)  # fmt: skip

    engine_replies: dict[int, list[int]] = {}
    batcher = ContinuousBatcher(target, max_batch=args.batch_size)
    start = time.perf_counter()
    stats = batcher.run(
        [Request(key=i, prompt=p, sampling=SamplingConfig(max_new_tokens=args.max_new_tokens))
         for i, p in enumerate(prompts)],
        lambda req, rep: engine_replies.__setitem__(req.key, rep.token_ids),
    )  # fmt: skip
    engine_s = time.perf_counter() - start
    engine_tokens = stats.new_tokens
    print(
        f"headstart continuous batch {args.batch_size}: {engine_tokens} tokens in {engine_s:.1f} s",
        file=sys.stderr,
    )

    base_tokens, identical = 0, 0
    start = time.perf_counter()
    for i, ids in enumerate(base_prompts):
        reply = generate_batch(target, [ids], Sampling(args.max_new_tokens))[0]
        base_tokens += len(reply.token_ids) + int(reply.finished)
        identical += int(reply.token_ids == engine_replies[i])
    base_s = time.perf_counter() - start
    print(f"generate batch 1: {base_tokens} tokens in {base_s:.1f} s", file=sys.stderr)

    result = {
        "prompts": len(prompts),
        "baseline_prompts": len(base_prompts),
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "generate_batch1_tokens_per_s": round(base_tokens / base_s, 2),
        "headstart_tokens_per_s": round(engine_tokens / engine_s, 2),
        "ratio": round((engine_tokens / engine_s) / (base_tokens / base_s), 2),
        "identical_replies": f"{identical}/{len(base_prompts)}",
        "engine": stats.as_dict(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Distillation's batchers side by side on the same prompts, interleaved run by run (this host is
noisy): the continuous batcher with prefill groups cut by the token budget alone (before
2026-11-26), the same with padding-aware groups (inference/grouping.py: what `distill` runs),
and the speculative engine's batcher (the one engine; no heads). Every run's replies must
equal the first's (greedy), or the script fails.

    python scripts/bench_batchers.py --questions ../shared/data/eval/mt_bench/question.jsonl \
        --num 48 --batch-size 16 --max-new-tokens 64 --threads 2 --rounds 2
On a GPU (what must be measured before the continuous batcher is retired; the staged GGUF and
the first 40 MT-bench questions of scripts/gpu/stage.sh, prompts repeated to fill the batch):
    python3 scripts/bench_batchers.py --target /root/stage/smollm2.gguf --device cuda \
        --questions .gpu/questions.jsonl --num 40 --repeat 16 --batch-size 256 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's headstart (a bare GPU machine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--questions", required=True, help="JSONL with a 'turns' list (MT-bench)")
    parser.add_argument("--num", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=1, help="each question this many times (a GPU batch)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (on a GPU: --batch-size 256 or more)")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent))  # the retired batcher lives in scripts/reference/
    from reference.continuous_batcher import ContinuousBatcher

    from headstart.inference.batcher import EngineBatcher
    from headstart.inference.plain import SamplingConfig
    from headstart.inference.requests import Request
    from headstart.targets import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    with open(args.questions, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()][: args.num]
    prompts = [target.chat.user_prompt_ids(row["turns"][0]) for row in rows] * args.repeat
    batch, every = args.batch_size, max(1, args.batch_size // 8)
    makers = {
        "continuous, budget-only groups": lambda: ContinuousBatcher(
            target, max_batch=batch, admit_every=every, prefill_overhead=10**9
        ),
        "continuous, padding-aware groups": lambda: ContinuousBatcher(
            target, max_batch=batch, admit_every=every
        ),
        "engine (no heads)": lambda: EngineBatcher(target, max_batch=batch, admit_every=every),
    }
    totals = {name: {"wall_s": 0.0, "prefill_s": 0.0, "tokens": 0} for name in makers}
    reference = None
    for round_ in range(args.rounds):
        for name, make in makers.items():
            got: dict[int, list[int]] = {}
            requests = [
                Request(key=i, prompt=p, sampling=SamplingConfig(max_new_tokens=args.max_new_tokens))
                for i, p in enumerate(prompts)
            ]
            start = time.perf_counter()
            stats = make().run(
                requests, lambda request, reply, got=got: got.__setitem__(request.key, reply.token_ids)
            )
            wall = time.perf_counter() - start
            reference = reference or got
            if got != reference:
                raise SystemExit(f"{name}: replies differ from the first run's")
            row = totals[name]
            row["wall_s"] += wall
            row["prefill_s"] += stats.prefill_s
            row["tokens"] += sum(len(v) for v in got.values())
            print(f"round {round_ + 1} {name}: {wall:.1f} s (prefill {stats.prefill_s:.1f} s)", flush=True)
    first = next(iter(totals.values()))["wall_s"]
    print(
        "\n| batcher | generated tok/s | prefill s per run | throughput vs the first |\n|---|---:|---:|---:|"
    )
    for name, row in totals.items():
        print(f"| {name} | {row['tokens'] / row['wall_s']:.1f} | {row['prefill_s'] / args.rounds:.1f} | "
              f"{first / row['wall_s']:.3f} |")  # fmt: skip
    print("every run's replies identical: yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

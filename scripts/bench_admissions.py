#!/usr/bin/env python
"""How a server's admissions cost, in process (no HTTP, so runs a few seconds apart compare): a
closed loop at concurrency C on the one engine `headstart serve` runs, each finished request
replaced by the next at once, greedy, interleaved variant by variant and round by round:

- `single`: each wave of newcomers prefilled in ONE forward padded to its longest prompt (the
  engine before 2026-11-27);
- `grouped`: the wave cut into groups of like length (inference/grouping.py);
- `prefix`: grouped, and the prompts' shared opening (the chat template's system turn) prefilled
  once and kept across waves (inference/prefix.py, `serve --prefix-cache 8`);
- `observe`: as `prefix`, but the drafter observes each plain step's token at once instead of at
  its next draft (inference/pending.py; the engine before that change).

Every variant's replies must equal the first's, or the script fails. Prints tok/s, the seconds
spent admitting (prefill) and stepping, and ms per step.

    python scripts/bench_admissions.py --questions ../shared/data/eval/mt_bench/question.jsonl \\
        --requests 32 --concurrency 8 --max-new-tokens 128 --rounds 2          # shipped heads
    python scripts/bench_admissions.py ... --no-heads
    python scripts/bench_admissions.py ... --variants prefix,observe --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's headstart

VARIANTS = ("single", "grouped", "prefix", "observe")


def run(variant: str, target: Any, heads: Any, tree: Any, prompts: list[list[int]], concurrency: int,
        max_new: int) -> dict:  # fmt: skip
    import contextlib
    from unittest import mock

    from headstart.inference import engine as engine_module
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.engine import Engine, Job
    from headstart.inference.plain import SamplingConfig
    from headstart.inference.prefix import SharedPrefix
    from headstart.inference.stops import StopRule

    decoder = SpeculativeDecoder(target, heads, tree=tree)
    prefix = (
        SharedPrefix(target, 8, layers=decoder.feature_layers) if variant in ("prefix", "observe") else None
    )
    # `headstart serve`'s setting on a CPU: speculate while one request's tree is the verify
    engine = Engine(
        decoder, SamplingConfig(max_new_tokens=1), speculate_up_to=decoder.verify_nodes, prefix=prefix
    )
    if variant == "observe":
        engine._defers = False  # every plain step's token observed at once
    eos = frozenset(target.eos_token_ids)
    jobs = [Job(key=i, prompt=p, rule=StopRule(max_new, eos)) for i, p in enumerate(prompts)]
    single = mock.patch.object(engine_module, "prefill_groups", lambda items, *_: [list(items)])
    admit_s = step_s = 0.0
    steps = done = nxt = 0
    start = time.perf_counter()
    with single if variant == "single" else contextlib.nullcontext():
        while done < len(jobs):
            wave = jobs[nxt : nxt + concurrency - engine.live]
            nxt += len(wave)
            if wave:
                t = time.perf_counter()
                done += len(engine.add(wave))
                admit_s += time.perf_counter() - t
            t = time.perf_counter()
            done += len(engine.step())
            step_s += time.perf_counter() - t
            steps += 1
    wall = time.perf_counter() - start
    tokens = sum(len(j.emitted) for j in jobs)
    return {"variant": variant, "tok_s": tokens / wall, "admit_s": admit_s, "step_s": step_s,
            "ms_per_step": 1000 * step_s / steps, "replies": [j.emitted for j in jobs]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--questions", required=True, help="JSONL with a 'turns' list (MT-bench)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--no-heads", action="store_true", help="plain decoding (default: the shipped heads)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma list from {','.join(VARIANTS)}"
    )
    args = parser.parse_args()
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")

    import torch

    from headstart.bench.questions import load_questions
    from headstart.heads import load_heads
    from headstart.heads.defaults import default_heads
    from headstart.targets import load_target
    from headstart.tuned import tree_for_run

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    heads = tree = None
    if not args.no_heads:
        path = default_heads(args.target)
        if path is None:
            raise SystemExit(f"{args.target} has no shipped heads: pass --no-heads")
        heads = load_heads(path, target)
        choice = tree_for_run(None, path, str(target.device), args.threads, True)  # generate's
        tree = choice.text if choice else "static"
    questions = [q.turns[0] for q in load_questions(args.questions)]
    n = min(args.requests, len(questions))  # spread over the file, as bench_serve.py picks them
    prompts = [target.chat.user_prompt_ids(questions[i * len(questions) // n]) for i in range(n)]
    print(f"{n} requests at concurrency {args.concurrency}, {args.max_new_tokens} tokens, greedy, "
          f"{'no heads' if heads is None else f'shipped heads, tree {tree}'}, {args.threads} threads")  # fmt: skip
    print("| round | variant | tok/s | admitting s | stepping s | ms/step |\n|---|---|---:|---:|---:|---:|")
    reference = None
    for round_ in range(1, args.rounds + 1):
        for variant in variants:
            got = run(variant, target, heads, tree, prompts, args.concurrency, args.max_new_tokens)
            if reference is None:
                reference = got["replies"]
            elif got["replies"] != reference:
                print(f"{variant}: replies differ from the first run's", file=sys.stderr)
                return 1
            print(f"| {round_} | {variant} | {got['tok_s']:.1f} | {got['admit_s']:.2f} | {got['step_s']:.2f} | "
                  f"{got['ms_per_step']:.1f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

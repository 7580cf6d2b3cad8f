#!/usr/bin/env python
"""What a decode step's draft costs beside its verify, by head kind and shape, on this machine.

Decodes one prompt with freshly built heads (a head's cost does not depend on its training) and
times, per step, the drafter's work (DFlash: the committed positions' keys and values, one block
forward and the lm_head rows of the depths drafted; EAGLE-3: the committed positions, then one
head pass per depth) and the target's verify forward of the same tree.

    python scripts/bench_draft.py --target smollm2 --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import torch


def timed(table: dict[str, float], key: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table[key] += time.perf_counter() - start

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from headstart.heads import HeadSpec, build_head
    from headstart.inference import drafters
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.targets import load_target

    target = load_target(args.target)
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    prompt = target.chat.user_prompt_ids(
        "Explain in detail how a refrigerator keeps food cold, step by step."
    )
    cases: list[tuple[str, Any, tuple[str, ...]]] = [
        ("eagle3", HeadSpec(kind="eagle3", draft_vocab_size=8192), ("chain:3", "chain:6"))
    ]
    for layers in (1, 2, 3):
        spec = HeadSpec(kind="dflash", num_layers=layers, block_size=16, draft_vocab_size=8192)
        cases.append((f"dflash, {layers} layer(s)", spec, ("chain:3", "chain:6", "chain:15")))
    print(f"{args.threads} threads, prompt {len(prompt)} tokens, {args.max_new_tokens} new tokens")
    print("| head | tree | draft ms a step | verify ms a step | draft / verify |\n|---|---|---:|---:|---:|")
    for name, spec, trees in cases:
        head = build_head(spec, target, token_counts=counts).eval().requires_grad_(False)
        for tree in trees:
            spent: dict[str, float] = defaultdict(float)
            decoder = SpeculativeDecoder(target, head, tree=tree)
            original = drafters.make_drafter

            def instrumented(*a: Any, original: Any = original, spent: Any = spent, **k: Any) -> Any:
                drafter = original(*a, **k)
                drafter.observe = timed(spent, "draft", drafter.observe)
                return drafter

            decoder.draft = timed(spent, "draft", decoder.draft)
            decoder.verify = timed(spent, "verify", decoder.verify)
            try:
                import headstart.inference.engine as module

                module.make_drafter = instrumented
                decoder.generate([prompt], max_new_tokens=8, eos_token_id=None)  # warm-up
                spent.clear()
                out = decoder.generate([prompt], max_new_tokens=args.max_new_tokens, eos_token_id=None)
            finally:
                module.make_drafter = original
            steps = out.stats.target_forwards - 1  # the prefill's observe is in "draft" too: small
            draft, verify = 1000 * spent["draft"] / steps, 1000 * spent["verify"] / steps
            print(f"| {name} | {tree} | {draft:.2f} | {verify:.2f} | {draft / verify:.2f} |")


if __name__ == "__main__":
    main()

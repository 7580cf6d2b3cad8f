#!/usr/bin/env python
"""Why `headstart serve` computes logprobs from one scoring forward (headstart/serve/logprobs.py):
the target's log-softmax at the same positions of the same tokens, computed three ways (one forward
over the whole sequence; plain 1-token steps on a KV cache, as `--no-heads` decodes; 4-token
chunks, the shape of a verify), differs in the last bits, so logprobs read from the decode steps
would differ with heads on and off.

    python scripts/check_logprob_bits.py --target smollm2
"""

from __future__ import annotations

import argparse

import torch

from headstart.targets import forward, load_target, new_cache
from headstart.targets.packing import PackedLinears, packed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--prompt", default="Why is the sky blue?")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    target = load_target(args.target)
    model, prompt = target.model, target.chat.user_prompt_ids(args.prompt)
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=args.tokens, do_sample=False)[0].tolist()
    start, packer = len(prompt), PackedLinears.for_model(model)

    @torch.no_grad()
    def stepped(chunk: int) -> torch.Tensor:  # the decode's way: a cache, `chunk` tokens a forward
        cache = new_cache(model)
        forward(model, torch.tensor([ids[:start]]), past_key_values=cache, logits_to_keep=1)
        rows = []
        for at in range(start, len(ids), chunk):
            part = ids[at : at + chunk]
            with packed([packer], len(part)):  # the small-row kernel, as decode steps run it
                rows.append(forward(model, torch.tensor([part]), position_ids=torch.arange(at, at + len(part))[None],
                                    past_key_values=cache).logits[0])  # fmt: skip
        return torch.cat(rows).log_softmax(-1)  # positions start .. L-1

    with torch.no_grad():
        whole = forward(model, torch.tensor([ids])).logits[0, start:].log_softmax(-1)
    ways = {"plain steps": stepped(1), "4-token chunks": stepped(4), "one forward": whole}
    names = list(ways)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            gap = (ways[a] - ways[b]).abs().max().item()
            same = int((ways[a] == ways[b]).all(-1).sum())
            print(
                f"{a} vs {b}: max |logprob difference| {gap:.3g}, bitwise equal positions {same}/{whole.shape[0]}"
            )


if __name__ == "__main__":
    main()

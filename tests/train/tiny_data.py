"""Self-distilled training data for a tiny target: random prompts, the target's own greedy replies
(so held-out accuracy against the target's argmax can rise when training works)."""

from __future__ import annotations

import torch

from headstart.train.data import TrainData


def self_distilled(
    target, count: int = 24, prompt_len: int = 8, reply_len: int = 24, seed: int = 0, vary: bool = False
) -> TrainData:
    """`vary`: trim conversation i by i % 7 tokens, so batches hold different token counts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, target.vocab_size, (count, prompt_len), generator=gen)
    with torch.no_grad():
        out = target.model.generate(
            prompts, max_new_tokens=reply_len, min_new_tokens=reply_len, do_sample=False, pad_token_id=0
        )
    ids = [row[: len(row) - (i % 7 if vary else 0)] for i, row in enumerate(out.tolist())]
    masks = [[0] * prompt_len + [1] * (len(row) - prompt_len) for row in ids]
    return TrainData(
        ids, masks, fingerprint=dict(target.fingerprint), description=f"tiny self-distilled ({count})"
    )

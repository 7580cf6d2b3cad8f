"""Measure the target's single-token forward latency (the unit every speed-up is made of)."""

from __future__ import annotations

import statistics
import time

import torch

from headstart.targets.features import cache_keyword, new_cache
from headstart.targets.load import Target

REPEATS = 22
"""Tokens decoded after the prefill: 2 warm-up + 20 timed (the context must hold them too)."""


@torch.no_grad()
def single_token_latency_ms(
    target: Target, context: int = 128, repeats: int = REPEATS - 2, kernels: bool = False
) -> float:
    """Median wall time of one cached 1-token forward after a `context`-token prefill.
    kernels: through headstart's CPU decode kernels (targets/packing.py), as the decoders run it;
    else transformers' own forward, as `generate` runs it."""
    import contextlib

    from headstart.targets.packing import PackedLinears, packed

    model = target.model
    decode = (lambda: packed([PackedLinears.for_model(model)], 1)) if kernels else contextlib.nullcontext
    vocab = min(target.vocab_size, target.tokenizer.vocab_size)
    ids = torch.randint(0, vocab, (1, context + repeats + 2), device=target.device)
    if kernels:
        cache = new_cache(model)  # headstart's growing cache, as its decoders use it
    else:  # transformers' own cache, as generate uses it (it copies as it grows: ~12% at 4k context)
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
    model(ids[:, :context], **{cache_keyword(type(model).forward): cache}, use_cache=True)
    times = []
    for step in range(repeats + 2):
        pos = context + step
        start = time.perf_counter()
        with decode():
            model(ids[:, pos : pos + 1], **{cache_keyword(type(model).forward): cache}, use_cache=True)
        if ids.is_cuda:
            torch.cuda.synchronize()  # cost: host-device sync, needed for a real timing
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[2:])  # the first two are warm-up

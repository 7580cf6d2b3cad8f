"""What a verify forward costs on this hardware, as a function of the number of tree nodes.

The tuner combines this curve with the heads' measured acceptance: a bigger tree accepts more
tokens per step but every node costs target compute, and on a CPU the cost grows fast.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from headstart.inference.cache import truncate
from headstart.targets import Target, forward, new_cache, tree_attention_mask
from headstart.targets.packing import PackedLinears, packed


@torch.no_grad()
def verify_cost_ms(
    target: Target,
    node_counts: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    context: int = 256,
    repeats: int = 5,
    pick: Callable[[list[float]], float] = statistics.median,
) -> dict[int, float]:
    """Median ms (or `pick`'s: the calibration takes the fastest, which load can only slow) of one
    target forward over `n` new tokens after a `context`-token cached prefix.

    Uses a chain-shaped tree mask: the mask's shape, not its pattern, sets the cost. Runs through
    the packed linears as the decoder's verify does (fp32 on CPU; the first, untimed repeat packs).
    """
    model = target.model
    vocab = min(target.vocab_size, target.tokenizer.vocab_size)
    prefix = torch.randint(0, vocab, (1, context), device=target.device)
    cache = new_cache(model)
    forward(model, prefix, past_key_values=cache)
    visible_prefix = torch.ones(1, context, dtype=torch.bool, device=target.device)
    packer = PackedLinears.for_model(model)
    costs = {}
    for n in node_counts:
        tokens = torch.randint(0, vocab, (1, n), device=target.device)
        mask = tree_attention_mask(visible_prefix, torch.ones(n, n, dtype=torch.bool).tril(), target.dtype)
        positions = torch.arange(context, context + n, device=target.device)[None]
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            with packed([packer], n):
                forward(model, tokens, attention_mask=mask, position_ids=positions, past_key_values=cache)
            if tokens.is_cuda:
                torch.cuda.synchronize()  # cost: host-device sync, needed for a real timing
            times.append(time.perf_counter() - start)
            truncate(cache, context)  # keep the context fixed at `context`
        costs[n] = 1000 * pick(times[1:])
    return costs


PAY_MARGIN = 0.03
"""The share by which a tree must beat plain decoding, and its tau its verify's cost, to be used
(headstart.calibration.judge and `headstart tune` both)."""


def tau_floor(verify_ms: dict[int, float], nodes: int, margin: float) -> float:
    """The tau a tree of `nodes` verify nodes must beat to pay at all: a round commits tau tokens
    and costs at least its verify forward, verify_ms[nodes] / verify_ms[1] plain steps (at least
    one: a round is one target forward or more), plus `margin`. The drafts cost more on top; this
    is the part no clock noise can move when the timings are each the fastest of several repeats."""
    one, mine = verify_ms.get(1), verify_ms.get(nodes)
    cost = mine / one if one and mine else 1.0
    return max(1.0, cost) * (1 + margin)

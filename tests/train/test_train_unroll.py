"""The training-time-test unroll equals drafting a chain with a KV cache, as the decoder does."""

from __future__ import annotations

import pytest
import torch

from headstart.heads import HeadSpec, build_head
from headstart.train.losses import ahead
from headstart.train.objective import unroll, unroll_scored


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.target import load_target

    return load_target(str(tiny_llama))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_unroll_step_j_equals_cached_chain_drafting(target, kind):
    torch.manual_seed(0)
    head = build_head(HeadSpec(kind=kind), target)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    length, steps = 9, 3
    h0, ids = torch.randn(1, length, 64), torch.randint(0, target.vocab_size, (1, length))
    with torch.no_grad():
        outs = unroll(head, h0, ids, steps)
        for t in (0, 3, 5):
            cache = head.new_cache()
            # Prefill positions 0..t with the true features and next tokens x_{1..t+1}.
            g = head(
                h0[:, : t + 1],
                ahead(ids, 1)[:, : t + 1],
                position_ids=torch.arange(t + 1)[None],
                past_key_values=cache,
            )
            g = g[:, -1:]
            torch.testing.assert_close(outs[0][:, t], g[:, 0], atol=1e-5, rtol=1e-5)
            for j in range(1, steps):
                if t + 1 + j >= length:
                    break
                token = ids[:, t + 1 + j : t + 2 + j]
                g = head(g, token, position_ids=torch.tensor([[t + j]]), past_key_values=cache)
                torch.testing.assert_close(outs[j][:, t], g[:, 0], atol=1e-5, rtol=1e-5)


def test_sparse_unroll_equals_the_full_unroll_where_later_steps_score(target):
    torch.manual_seed(1)
    head = build_head(HeadSpec(kind="eagle3"), target)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    length, steps = 12, 4
    h0, ids = torch.randn(2, length, 64), torch.randint(0, target.vocab_size, (2, length))
    mask = torch.zeros(2, length, dtype=torch.long)
    mask[0, 6:] = 1  # a reply at the end
    mask[1, 4:8] = 1  # a shorter one in the middle (the rest of the row is prompt or padding)
    with torch.no_grad():
        full = unroll(head, h0, ids, steps)
        sparse, order, valid = unroll_scored(head, h0, ids, mask, steps)
    torch.testing.assert_close(sparse[0], full[0])
    # step j >= 1 at t scores x_{t+2+j}: t = 1..8 in row 0, t = 0..4 in row 1
    assert [order[b][valid[b]].tolist() for b in range(2)] == [list(range(1, 9)), list(range(5))]
    for j in range(1, steps):
        for b in range(2):
            at = order[b][valid[b]]
            torch.testing.assert_close(sparse[j][b, valid[b]], full[j][b, at], atol=1e-5, rtol=1e-5)

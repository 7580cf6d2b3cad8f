"""The training-time-test unroll equals drafting a chain with a KV cache, as the decoder does."""

from __future__ import annotations

import pytest
import torch
from tiny import FAMILIES, FC_LAYOUT, make_target_dir

from headstart.heads import HeadSpec, build_head
from headstart.train.losses import ahead
from headstart.train.objectives.eagle.unroll import unroll, unroll_scored


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


@pytest.mark.parametrize("kind,layers", [("eagle", 1), ("eagle3", 1), ("eagle3", 2)])
def test_unroll_step_j_equals_cached_chain_drafting(target, kind, layers):
    torch.manual_seed(0)
    head = build_head(HeadSpec(kind=kind, num_layers=layers), target)
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


def sparse_and_full(target, layout, **options):
    torch.manual_seed(1)
    head = build_head(HeadSpec(kind="eagle3", layout=layout, **options), target)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    length, steps = 12, 4
    h0 = torch.randn(2, length, target.hidden_size)
    ids = torch.randint(0, target.vocab_size, (2, length))
    mask = torch.zeros(2, length, dtype=torch.long)
    mask[0, 6:] = 1  # a reply at the end
    mask[1, 4:8] = 1  # a shorter one in the middle (the rest of the row is prompt or padding)
    with torch.no_grad():
        return unroll(head, h0, ids, steps), *unroll_scored(head, h0, ids, mask, steps)


@pytest.mark.parametrize(
    "layout,options",
    [
        ("reference", {}),
        ("fc", {}),
        ("reference", {"num_layers": 2}),
        ("reference", {"draft_layer": "qwen3"}),
    ],
    ids=["reference", "fc", "layers2", "qwen3"],
)
def test_sparse_unroll_equals_the_full_unroll_where_steps_score(target, layout, options):
    """Two draft layers too: the first runs whole at prompt positions (the second's keys read
    its output), the last caches keys and values only."""
    full, sparse, positions, valid = sparse_and_full(target, layout, **options)
    steps = len(full)
    # step 0 at t scores x_{t+2}, step j >= 1 x_{t+2+j}: later steps run at t = 1..8 in row 0 and
    # t = 0..4 in row 1, step 0 there and where it alone scores (t = 9; t = 2..5)
    real = lambda j: [positions[j][b][valid[j][b]].tolist() for b in range(2)]  # noqa: E731
    assert real(0) == [list(range(1, 10)), list(range(6))]
    assert all(real(j) == [list(range(1, 9)), list(range(5))] for j in range(1, steps))
    for j in range(steps):
        for b in range(2):
            at = positions[j][b][valid[j][b]]
            torch.testing.assert_close(sparse[j][b, valid[j][b]], full[j][b, at], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sparse_unroll_equals_the_full_unroll_on_every_family(tiny_root, family):
    """Prompt positions only cache keys and values (the MLP is skipped where the layer is
    Llama-style pre-norm, the whole layer runs elsewhere): the same outputs on every family."""
    from headstart.targets import load_target

    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    full, sparse, positions, valid = sparse_and_full(target, "fc" if family in FC_LAYOUT else "reference")
    for j in range(len(full)):
        for b in range(2):
            at = positions[j][b][valid[j][b]]
            torch.testing.assert_close(sparse[j][b, valid[j][b]], full[j][b, at], atol=1e-5, rtol=1e-5)

"""Grouped-query attention inside sdpa for masked tree queries: the same numbers as transformers'
repeat-KV path, used only inside the forward, and only where it applies."""

from __future__ import annotations

import pytest
import torch

import headstart.targets.attention as attention
from headstart.targets import forward, load_target, new_cache, tree_attention_mask


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def _tree_forward(target, grouped: bool):
    """Prefill 12 tokens, then verify a 5-node tree (two branches) on top; returns the logits."""
    model = target.model
    torch.manual_seed(0)
    ids = torch.randint(3, target.vocab_size, (2, 17))
    cache = new_cache(model)
    forward(model, ids[:, :12], past_key_values=cache)
    sees = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]])
    mask = tree_attention_mask(
        torch.ones(2, 12, dtype=torch.bool), sees.bool()[None].expand(2, -1, -1), model.dtype
    )
    depths = torch.tensor([[0, 1, 2, 1, 2]]).expand(2, -1)
    if grouped:
        return forward(
            model, ids[:, 12:], attention_mask=mask, position_ids=12 + depths, past_key_values=cache
        ).logits
    with torch.no_grad():
        return model(ids[:, 12:], attention_mask=mask, position_ids=12 + depths, past_key_values=cache).logits


def test_same_logits_as_repeated_kv_and_the_config_is_restored(target, monkeypatch):
    assert target.model.config.num_key_value_heads < target.model.config.num_attention_heads  # a GQA target
    assert attention.usable(target.model)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        if args[0].shape[2] == 5:  # the tree's queries (the prefill has no mask: grouped anyway)
            calls.append(kwargs.get("enable_gqa", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ours = _tree_forward(target, grouped=True)
    assert calls and all(calls), calls  # every layer ran with grouping inside the kernel
    calls.clear()
    reference = _tree_forward(target, grouped=False)  # transformers' own path: repeat_kv
    assert calls and not any(calls)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    assert target.model.config._attn_implementation == "sdpa"


def test_restored_after_an_error_and_skipped_for_other_attention(target):
    with pytest.raises(RuntimeError), attention.grouped_query_attention(target.model):
        assert target.model.config._attn_implementation == attention.NAME
        raise RuntimeError("boom")
    assert target.model.config._attn_implementation == "sdpa"
    target.model.config._attn_implementation = "eager"
    try:
        with attention.grouped_query_attention(target.model):
            assert target.model.config._attn_implementation == "eager"
    finally:
        target.model.config._attn_implementation = "sdpa"


def test_one_masked_query_per_row_folds_the_group_and_matches(target, monkeypatch):
    """A batched decode step (one token per row, a padding mask): the query heads of a group
    become query rows over their KV head, read once, with transformers' numbers."""
    model = target.model
    torch.manual_seed(1)
    ids = torch.randint(3, target.vocab_size, (3, 9))
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[0, :3] = False  # left padding in row 0
    mask = tree_attention_mask(valid, torch.ones(3, 1, 1, dtype=torch.bool), model.dtype)
    shapes, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        shapes.append(tuple(args[0].shape))
        return real(*args, **kwargs)

    def step(grouped: bool):
        cache = new_cache(model)
        forward(model, ids[:, :8], past_key_values=cache)
        kwargs = dict(attention_mask=mask, position_ids=torch.full((3, 1), 8), past_key_values=cache)
        if grouped:
            return forward(model, ids[:, 8:], **kwargs).logits
        with torch.no_grad():
            return model(ids[:, 8:], **kwargs).logits

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ours = step(True)
    kv, q = model.config.num_key_value_heads, model.config.num_attention_heads
    assert (3, kv, q // kv, model.config.head_dim) in shapes
    torch.testing.assert_close(ours, step(False), rtol=1e-5, atol=1e-5)

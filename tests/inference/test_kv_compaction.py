"""KV compaction: gathering accepted entries, and verify -> compact -> continue equals decoding
the accepted path sequentially."""

from __future__ import annotations

import pytest
import torch

from headstart.inference import cache as kv
from headstart.inference.trees.static import build_tree
from headstart.targets import forward, load_target, new_cache, tree_attention_mask


@pytest.fixture(params=["dynamic", "growing"])
def make_cache(request, tiny_llama):
    """transformers' DynamicCache, and ours whose layers append in place (new_cache)."""
    from transformers import DynamicCache

    from headstart.targets.growing_cache import growing_cache

    if request.param == "dynamic":
        return DynamicCache
    config = load_target(str(tiny_llama)).model.config
    return lambda: growing_cache(config)


def test_keep_entries_gathers_per_row(make_cache):
    cache = make_cache()
    keys = torch.arange(2 * 1 * 7 * 1, dtype=torch.float32).reshape(2, 1, 7, 1)  # (B, heads, S, D)
    cache.update(keys, -keys, 0)
    kv.keep_entries(cache, 3, torch.tensor([[0, 2], [3, 3]]))
    layer = cache.layers[0]
    assert layer.keys[:, 0, :, 0].tolist() == [[0, 1, 2, 3, 5], [7, 8, 9, 13, 13]]
    assert torch.equal(layer.values, -layer.keys)
    kv.truncate(cache, 4)
    assert kv.cache_length(cache) == 4
    kv.select_rows(cache, torch.tensor([1]))
    assert layer.keys[:, 0, :, 0].tolist() == [[7, 8, 9, 13]]


def test_keep_entries_in_place_path_and_the_next_update(make_cache):
    """A path already in place (a chain) only shortens the cache; the next forward's update
    appends after the kept entries, never after the dropped ones."""
    cache = make_cache()
    keys = torch.arange(7, dtype=torch.float32).reshape(1, 1, 7, 1)
    cache.update(keys, -keys, 0)
    kv.keep_entries(cache, 3, torch.tensor([[0, 1]]))
    cache.update(torch.full((1, 1, 2, 1), 50.0), torch.full((1, 1, 2, 1), -50.0), 0)
    layer = cache.layers[0]
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 50, 50]
    assert torch.equal(layer.values, -layer.keys)


def test_views_a_round_program_leaves_are_sliced_when_next_read(tiny_llama):
    """`end_at` (the round program writes past the views in place): the layer reports the new
    length without slicing, slices on the next read of keys or values, and every other path
    (an update, a reset) sees the sliced views first."""
    from headstart.targets.growing_cache import growing_cache

    cache = growing_cache(load_target(str(tiny_llama)).model.config, reserve=16)
    keys = torch.arange(4, dtype=torch.float32).reshape(1, 1, 4, 1)
    for layer in cache.layers:
        layer.update(keys, -keys)
    layer = cache.layers[0]
    layer._key_buffer[:, :, 4:6] = torch.tensor([10.0, 11.0]).reshape(1, 1, 2, 1)  # written in place
    layer._value_buffer[:, :, 4:6] = -layer._key_buffer[:, :, 4:6]
    for other in cache.layers:
        other.end_at(6)
    assert layer.ends() == 6 and kv.cache_length(cache) == 6  # known without slicing
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 10, 11] and layer.ends() is None
    assert torch.equal(layer.values, -layer.keys)
    layer.end_at(5)
    layer.update(torch.full((1, 1, 1, 1), 7.0), torch.full((1, 1, 1, 1), -7.0))  # appends after the 5
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 10, 7]
    layer.end_at(6)
    layer.reset()
    assert layer.ends() is None


def test_growing_layers_append_in_place_and_survive_row_selection(tiny_llama):
    from headstart.targets.growing_cache import growing_cache

    cache = growing_cache(load_target(str(tiny_llama)).model.config)
    keys = torch.arange(2 * 5, dtype=torch.float32).reshape(2, 1, 5, 1)
    cache.update(keys, -keys, 0)
    layer = cache.layers[0]
    start = layer.keys.data_ptr()
    keeps = [torch.tensor([[0], [0]]), torch.tensor([[1], [0]]), torch.tensor([[0, 1], [0, 1]])]
    for step, keep in enumerate(keeps):  # verify 2 nodes, keep a path: all inside the spare room
        new = torch.tensor([100.0 + step, 200.0 + step]).reshape(1, 1, 2, 1).expand(2, 1, 2, 1)
        cache.update(new, -new, 0)
        kv.keep_entries(cache, kv.cache_length(cache) - 2, keep)
        assert layer.keys.data_ptr() == start  # no new buffer, no copy of the prefix
    assert layer.keys[:, 0, :, 0].tolist() == [
        [0, 1, 2, 3, 4, 100, 201, 102, 202],
        [5, 6, 7, 8, 9, 100, 101, 102, 202],
    ]
    assert torch.equal(layer.values, -layer.keys)
    kv.select_rows(cache, torch.tensor([1]))
    cache.update(torch.full((1, 1, 1, 1), 7.0), torch.full((1, 1, 1, 1), -7.0), 0)
    assert layer.keys[0, 0, :, 0].tolist() == [5, 6, 7, 8, 9, 100, 101, 102, 202, 7]
    many = torch.ones(1, 1, 500, 1)  # past the spare room: a bigger buffer, same contents
    cache.update(many, -many, 0)
    assert (
        kv.cache_length(cache) == 510
        and layer.keys[0, 0, 9, 0] == 7
        and torch.equal(layer.values, -layer.keys)
    )


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def test_verify_compact_continue_matches_sequential(target):
    """Verify a tree, keep only one path's entries (batched, padded rows), then decode one more
    token: logits equal a fresh forward over prefix + path + token."""
    torch.manual_seed(0)
    model, tree = target.model, build_tree([[0], [1], [0, 0], [1, 0], [1, 0, 0]])
    prefix = torch.randint(3, 280, (2, 9))
    tokens = torch.randint(3, 280, (2, tree.size))
    cache = new_cache(model)
    forward(model, prefix, past_key_values=cache)
    visible = torch.ones(2, 9, dtype=torch.bool)
    mask = tree_attention_mask(visible, tree.visible, target.dtype)
    forward(
        model, tokens, attention_mask=mask, position_ids=9 + tree.depths.expand(2, -1), past_key_values=cache
    )
    paths = [[0, 2, 4, 5], [0, 1]]  # accepted nodes per row (row 1 shorter: padded by repetition)
    keep = torch.tensor([paths[0], paths[1] + [1, 1]])
    kv.keep_entries(cache, 9, keep)
    assert kv.cache_length(cache) == 13
    real = torch.tensor([[True] * 4, [True, True, False, False]])
    nxt = torch.randint(3, 280, (2, 1))
    lengths = torch.tensor([13, 11])
    mask = tree_attention_mask(
        torch.cat([visible, real], 1), torch.ones(1, 1, dtype=torch.bool), target.dtype
    )
    out = forward(model, nxt, attention_mask=mask, position_ids=lengths[:, None], past_key_values=cache)
    for b, path in enumerate(paths):
        seq = torch.cat([prefix[b], tokens[b, path], nxt[b]])[None]
        ref = model(seq).logits[0, -1]
        torch.testing.assert_close(out.logits[b, 0], ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=4,top_k=3,total_tokens=10", "chain:1+lookup:4"])
def test_the_cache_is_preallocated_once_for_the_whole_generation(tiny_llama, tree, monkeypatch):
    """Prompt + new tokens + one tree are reserved at prefill: every layer's buffer is allocated
    once and never moves (commit = index copy into it, rollback = a shorter view)."""
    from random_heads import RandomEagle

    import headstart.targets.growing_cache as growing
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.targets import load_target

    buffers = set()
    real = growing._append

    def counting(view, buffer, new, *args):
        out = real(view, buffer, new, *args)
        buffers.add(out[1].data_ptr())
        return out

    monkeypatch.setattr(growing, "_append", counting)
    target = load_target(str(tiny_llama))
    decoder = SpeculativeDecoder(target, RandomEagle(target.model), tree=tree)
    # 150 new tokens: a cache grown on demand (64 entries of headroom) would move at least once
    out = decoder.generate(
        [target.chat.user_prompt_ids("hello there")], max_new_tokens=150, eos_token_id=None
    )
    assert len(out.token_ids[0]) == 150
    layers = 2 * target.num_layers  # keys and values
    assert len(buffers) == layers, f"{len(buffers)} buffers for {layers} layer tensors: the cache moved"

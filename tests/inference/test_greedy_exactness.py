"""Greedy speculative decoding equals `target.model.generate(do_sample=False)` token for token:
every head kind x tree kind, batch 1 and batched (left padding), with and without EOS."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from random_heads import RandomEagle, RandomMedusa
from scripted import ScriptedDrafter

from headstart.inference.decoder import SpeculativeDecoder
from headstart.targets import load_target
from headstart.targets.mkl import mkl_packing_available
from headstart.targets.smallmm import small_matmul

# the exactness suite runs on every device: "cuda" (bf16, the `--dtype auto` default there) only
# where one exists, marked gpu (deselected by default: `pytest -m gpu` on a GPU machine)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
]
PROMPTS = ["hello there", "What is the capital of France? Answer briefly.", "a", "Write a poem about the sea"]
TREES = ["static", "dynamic:depth=4,top_k=3,total_tokens=10", "chain:3", "chain:1+lookup:4"]


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


@pytest.fixture(scope="module")
def cuda_target(tiny_llama):
    return load_target(str(tiny_llama), device="cuda", dtype="auto")  # bfloat16


def on_device(request, target, device: str):
    return target if device == "cpu" else request.getfixturevalue("cuda_target")


@pytest.fixture(scope="module")
def prompts(target):
    return [target.chat.user_prompt_ids(p) for p in PROMPTS]


_REFS: dict[tuple, list[int]] = {}


def reference(target, ids: list[int], max_new: int, eos: bool) -> list[int]:
    """The target's own `generate`, on its device and in its dtype (bf16 on CUDA)."""
    key = (target.spec, str(target.device), str(target.dtype), tuple(ids), max_new, eos)
    if key not in _REFS:
        _REFS[key] = _generate(target, ids, max_new, eos)
    return _REFS[key]


def _generate(target, ids: list[int], max_new: int, eos: bool) -> list[int]:
    x = torch.tensor([ids], device=target.device)
    out = target.model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=list(target.eos_token_ids) if eos else None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def make_heads(kind: str, target):
    """Heads on the target's device and in its dtype (as load_heads_for_inference puts them)."""
    if kind == "medusa":
        heads = RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    elif kind == "eagle":
        heads = RandomEagle(target.model)
    elif kind == "eagle3":
        heads = RandomEagle(target.model, draft_vocab=100, layers=(0, 1))
    else:
        return _real_heads(kind, target)
    return heads.to(device=target.device, dtype=target.dtype)


def _real_heads(kind: str, target):
    from headstart.heads import HeadSpec, build_head

    if kind in ("real-medusa-vocab", "real-dflash-vocab"):  # drafts over 100 tokens only
        counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
        name = kind.split("-")[1]
        spec = HeadSpec(kind=name, draft_vocab_size=100, **({"block_size": 4} if name == "dflash" else {}))
        return build_head(spec, target, token_counts=counts)
    spec = HeadSpec(kind=kind.removeprefix("real-"), draft_vocab_size=0)
    return build_head(spec, target)


@pytest.mark.parametrize(
    "kind",
    ["medusa", "eagle", "eagle3", "real-medusa", "real-eagle", "real-eagle3", "real-medusa-vocab", "real-dflash",
     "real-dflash-vocab"],
)  # fmt: skip
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_matches_generate(request, target, prompts, kind, tree, device):
    target = on_device(request, target, device)
    decoder = SpeculativeDecoder(target, make_heads(kind, target), tree=tree)
    # on CPU the verify runs through the small-row kernel (1-64 rows; targets/smallmm.py) where it
    # built, else MKL-packed linears (test below); elsewhere through the plain linears
    packs = device == "cpu" and (mkl_packing_available() or small_matmul() is not None)
    assert (decoder.packed is not None) == packs
    for batch in (prompts[:1], prompts):
        out = decoder.generate(batch, max_new_tokens=40, eos_token_id=None)
        for ids, got in zip(batch, out.token_ids, strict=True):
            assert got == reference(target, ids, 40, eos=False)
        assert out.stats.new_tokens == 40 * len(batch)


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.skipif(small_matmul() is None, reason="no C compiler: the kernel did not build")
@pytest.mark.parametrize("kind", ["real-eagle3", "real-dflash"])  # Medusa's heads run as one stacked matmul
def test_heads_saved_in_bf16_draft_from_their_bf16_rows(target, prompts, kind, tmp_path, monkeypatch):
    """Heads stored in bf16 and decoded in fp32 on a CPU read their bf16 rows (half the memory):
    the same drafts bit for bit (the same steps accepted), and generate's tokens."""
    from headstart.heads import load_heads_for_inference
    from headstart.targets import gguf_blocks

    kernel = small_matmul()
    monkeypatch.setattr(kernel, "block_rows", kernel.max_rows)
    path = _real_heads(kind, target).to(torch.bfloat16).save_pretrained(tmp_path / kind)
    rows, fp32 = load_heads_for_inference(path, target), load_heads_for_inference(path, target)
    assert not any(map(gguf_blocks.blocks_for, _linears(rows)))  # kept only once decoding starts
    decoders = [SpeculativeDecoder(target, rows, tree="static")]
    monkeypatch.setenv("HEADSTART_GGUF_BLOCKS", "0")  # the same heads on their fp32 weights
    decoders.append(SpeculativeDecoder(target, fp32, tree="static"))
    monkeypatch.delenv("HEADSTART_GGUF_BLOCKS")
    assert _linears(rows) and all(gguf_blocks.blocks_for(m).kind == gguf_blocks.BF16 for m in _linears(rows))
    assert not any(map(gguf_blocks.blocks_for, _linears(fp32)))
    read = []
    real = kernel._blocks_fn
    monkeypatch.setattr(kernel, "_blocks_fn", lambda *a: read.append(a[2]) or real(*a))
    outs = [decoder.generate(prompts, max_new_tokens=30, eos_token_id=None) for decoder in decoders]
    assert gguf_blocks.BF16 in read
    assert outs[0].stats.per_row_steps == outs[1].stats.per_row_steps  # the same drafts accepted
    for ids, got, other in zip(prompts, outs[0].token_ids, outs[1].token_ids, strict=True):
        assert got == other == reference(target, ids, 30, eos=False)


@pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch build has no MKL")
def test_greedy_matches_generate_on_mkl_packs(target, prompts, monkeypatch):
    """Without the small-row kernel (no C compiler) the verify takes MKL's packed weights."""
    monkeypatch.setenv("HEADSTART_SMALLMM", "0")
    small_matmul.cache_clear()
    try:
        decoder = SpeculativeDecoder(target, make_heads("real-eagle3", target), tree="static")
        out = decoder.generate(prompts, max_new_tokens=40, eos_token_id=None)
        for ids, got in zip(prompts, out.token_ids, strict=True):
            assert got == reference(target, ids, 40, eos=False)
        assert decoder.packed is not None and decoder.packed._packs  # packs were built and used
    finally:
        small_matmul.cache_clear()


@pytest.mark.parametrize("eos", [False, True])
def test_plain_cached_generate_matches_generate(target, prompts, eos):
    """The bench's `plain` baseline: headstart's forward, one token per forward, same tokens."""
    from headstart.inference.plain import SamplingConfig, cached_generate

    for ids in prompts:
        sampling = SamplingConfig(max_new_tokens=30)
        if eos:
            out = cached_generate(target, ids, sampling)
            assert out.token_ids == reference(target, ids, 30, eos=True)
        else:
            reduced = dataclasses.replace(target, eos_token_ids=())
            out = cached_generate(reduced, ids, sampling)
            assert out.token_ids == reference(target, ids, 30, eos=False) and out.new_tokens == 30
        assert out.target_forwards == out.new_tokens


@pytest.mark.parametrize("tree", TREES)
def test_scripted_drafts_accept_long_paths_exactly(target, prompts, tree):
    """Drafts that are mostly right: many tokens per forward, still exactly the target's output."""
    refs = [ids + reference(target, ids, 60, eos=False) for ids in prompts]
    decoder = SpeculativeDecoder(target, ScriptedDrafter(refs, target.vocab_size), tree=tree)
    out = decoder.generate(prompts, max_new_tokens=57, eos_token_id=None)
    for ids, ref, got in zip(prompts, refs, out.token_ids, strict=True):
        assert got == ref[len(ids) : len(ids) + 57]  # never one token more than max_new_tokens
    assert out.stats.tau > 2.0
    assert out.stats.target_forwards < 57 / 2


def test_eos_stops_each_row_like_generate(target, prompts):
    """With EOS on, rows stop at different steps (finished rows leave the batch)."""
    eos = 7  # a frequent byte on the tiny model makes rows stop early and at different points
    refs = []
    for ids in prompts:
        x = torch.tensor([ids])
        out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=50, do_sample=False,
                                    eos_token_id=[2, eos], pad_token_id=0)  # fmt: skip
        refs.append(out[0, len(ids) :].tolist())
    full = [ids + reference(target, ids, 60, eos=False) for ids in prompts]
    decoder = SpeculativeDecoder(target, ScriptedDrafter(full, target.vocab_size), tree="static")
    out = decoder.generate(prompts, max_new_tokens=50, eos_token_id=[2, eos])
    assert out.token_ids == refs


def test_stop_strings_and_max_new_tokens(target, prompts):
    ids = prompts[1]
    ref = reference(target, ids, 40, eos=False)
    text = target.tokenizer.decode(ref[10:14])
    decoder = SpeculativeDecoder(target, RandomEagle(target.model), tree="static")
    out = decoder.generate(ids, max_new_tokens=40, eos_token_id=None, stop_strings=[text])
    assert text in target.tokenizer.decode(out.token_ids[0])
    assert out.token_ids[0] == ref[: len(out.token_ids[0])] and len(out.token_ids[0]) <= 14
    one = decoder.generate(ids, max_new_tokens=1, eos_token_id=None)
    assert one.token_ids == [ref[:1]] and one.stats.target_forwards == 1


@pytest.mark.parametrize(("tree", "heads_run"), [("chain:1", 1), ("chain:2", 2), ("static", 3)])
def test_medusa_runs_only_the_heads_the_tree_reaches(target, prompts, tree, heads_run):
    heads = RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    counts = []
    forward = heads.forward
    heads.forward = lambda hidden, count=None: counts.append(count) or forward(hidden, count)
    out = SpeculativeDecoder(target, heads, tree=tree).generate(
        prompts[:1], max_new_tokens=12, eos_token_id=None
    )
    assert out.token_ids[0] == reference(target, prompts[0], 12, eos=False)
    assert counts and set(counts) == {heads_run}

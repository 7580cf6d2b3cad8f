"""Every decoder family, tree-verified exactly: a tiny random config per family, built from the
family's own config class, with sliding windows (8) much smaller than prompt + output (~60
tokens), mixed full/sliding layers where the family has them, MoE routing, soft-capping, sinks,
scaled embeddings and no-RoPE layers. Greedy speculative output with freshly initialised real
Medusa, EAGLE-3 and DFlash heads, and with scripted drafts that accept long paths (the window then slides
inside a committed path), equals `model.generate(do_sample=False)` token for token, alone and
batched with left padding."""

from __future__ import annotations

import pytest
import torch
from scripted import ScriptedDrafter
from tiny import FAMILIES, FC_LAYOUT, SLIDING_FAMILIES, WINDOW, make_target_dir

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head
from headstart.inference.decoder import SpeculativeDecoder
from headstart.targets import load_target
from headstart.targets.layer_kinds import SLIDING, layer_kinds

PROMPTS = ["hello there, how are you doing today?", "a", "Write a poem about the sea and the sky"]


def family_target(tiny_root, family: str):
    path = make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])
    return load_target(str(path))


def generate_ref(target, ids: list[int], max_new: int) -> list[int]:
    x = torch.tensor([ids])
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_greedy_is_exact(tiny_root, family):
    target = family_target(tiny_root, family)
    kinds = layer_kinds(target.model)
    assert (SLIDING in kinds.kinds) == (family in SLIDING_FAMILIES), kinds
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    assert all(len(ids) + 40 > 3 * WINDOW for ids in prompts)
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    layout = "fc" if family in FC_LAYOUT else "reference"
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    heads = {
        "medusa": build_head(HeadSpec(kind="medusa", draft_vocab_size=0), target),
        "eagle3": build_head(
            HeadSpec(kind="eagle3", draft_vocab_size=100, layout=layout), target, token_counts=counts
        ),  # fmt: skip
        "dflash": build_head(
            HeadSpec(kind="dflash", draft_vocab_size=100, block_size=5), target, token_counts=counts
        ),
        "scripted": ScriptedDrafter(
            [ids + ref for ids, ref in zip(prompts, refs, strict=True)], target.vocab_size
        ),
    }
    for name, head in heads.items():
        for tree in ("static", "dynamic:depth=4,top_k=3,total_tokens=10"):
            decoder = SpeculativeDecoder(target, head, tree=tree)
            for batch in ([0], [0, 1, 2]):
                if name == "scripted":  # it tracks rows by index: a fresh script per batch
                    decoder = SpeculativeDecoder(target, ScriptedDrafter(
                        [prompts[i] + refs[i] for i in batch], target.vocab_size), tree=tree)  # fmt: skip
                out = decoder.generate([prompts[i] for i in batch], max_new_tokens=40, eos_token_id=None)
                for i, got in zip(batch, out.token_ids, strict=True):
                    assert got == refs[i], (family, name, tree, batch)
                if name == "scripted":
                    assert out.stats.tau > 2.0  # long paths committed: the window slid inside them


def test_recurrent_layers_are_refused_in_one_line(tiny_root):
    """Linear-attention / recurrent state cannot be shared by a tree of drafts: one clear line."""
    path = make_target_dir(tiny_root, "qwen3_next", seed=11, num_hidden_layers=2, head_dim=16,
                           layer_types=["linear_attention", "full_attention"], num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                           linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                           linear_value_head_dim=16)  # fmt: skip
    target = load_target(str(path))
    decoder = SpeculativeDecoder(target, build_head(HeadSpec(kind="medusa", draft_vocab_size=0), target))
    with pytest.raises(HeadstartError, match="linear_attention layers.*--no-heads"):
        decoder.generate([target.chat.user_prompt_ids("hi")], max_new_tokens=4, eos_token_id=None)

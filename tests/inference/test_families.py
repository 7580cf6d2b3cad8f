"""Every decoder family, tree-verified exactly: a tiny random config per family, built from the
family's own config class, with sliding windows (8) much smaller than prompt + output (~60
tokens), mixed full/sliding layers where the family has them, MoE routing, soft-capping, sinks,
scaled embeddings and no-RoPE layers. Greedy speculative output with freshly initialised real
Medusa and EAGLE-3 heads, and with scripted drafts that accept long paths (the window then slides
inside a committed path), equals `model.generate(do_sample=False)` token for token, alone and
batched with left padding."""

from __future__ import annotations

import pytest
import torch
from scripted import ScriptedDrafter
from tiny import make_target_dir

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head
from headstart.inference.decoder import SpeculativeDecoder
from headstart.target import load_target
from headstart.target.layer_kinds import SLIDING, layer_kinds

W = 8  # every window: far below prompt + output
MIXED_4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MOE = dict(num_local_experts=4, num_experts_per_tok=2)
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=W),
    "qwen2": dict(use_sliding_window=True, sliding_window=W, max_window_layers=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=W, max_window_layers=1, head_dim=16),
    "qwen3_moe": dict(
        use_sliding_window=True,
        sliding_window=W,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        head_dim=16,
    ),  # fmt: skip
    "mixtral": dict(sliding_window=W, **MOE),
    "gemma2": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, query_pre_attn_scalar=16),
    "gemma3_text": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, layer_types=MIXED_4),
    "cohere2": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4),
    "phi3": dict(sliding_window=W),
    "gpt_oss": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, layer_types=MIXED_4, **MOE),
    "olmo2": {},
    "olmo3": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4),
    "smollm3": dict(no_rope_layers=[1, 0], use_sliding_window=False),
    "ministral": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4, head_dim=16),
}
SLIDING_FAMILIES = {"mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3_text", "cohere2",
                    "phi3", "gpt_oss", "olmo3", "ministral"}  # fmt: skip
# layers that are not Llama-style pre-norm (Cohere's parallel block, OLMo's post-norms, Phi-3's
# fused qkv) cannot take the reference EAGLE-3 layer: their EAGLE-3 head takes the fc layout
# (fc(2H->H) + the target's own layer), as the error says
FC_LAYOUT = {"cohere2", "olmo2", "olmo3", "phi3"}
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
    assert all(len(ids) + 40 > 3 * W for ids in prompts)
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    layout = "fc" if family in FC_LAYOUT else "reference"
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    heads = {
        "medusa": build_head(HeadSpec(kind="medusa", draft_vocab_size=0), target),
        "eagle3": build_head(
            HeadSpec(kind="eagle3", draft_vocab_size=100, layout=layout), target, token_counts=counts
        ),  # fmt: skip
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

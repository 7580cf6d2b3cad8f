"""Head modules on tiny Llama and Qwen2 targets: shapes, contract, init, cache consistency."""

from __future__ import annotations

import json

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.heads import DraftHead, EagleLike, HeadSpec, MedusaLike, build_head
from headstart.heads.config import HeadConfig
from headstart.targets import capture, tree_attention_mask


@pytest.fixture(params=["llama", "qwen2"])
def target(request, llama_target, qwen2_target):
    return {"llama": llama_target, "qwen2": qwen2_target}[request.param]


def test_medusa_shapes_zero_init_and_distinct_blocks(target):
    heads = build_head(HeadSpec(kind="medusa", num_heads=3, num_layers=2, shared_lm_head=False), target)
    assert isinstance(heads, MedusaLike) and isinstance(heads, DraftHead)
    ids = torch.randint(0, target.vocab_size, (2, 7))
    feats = capture(target.model, ids)
    logits = heads(feats.last_hidden)
    assert logits.shape == (3, 2, 7, target.vocab_size)
    # Zero-initialised blocks + lm_head copied from the target: every head starts as the target.
    torch.testing.assert_close(logits[1], feats.logits)
    blocks = [b.linear.weight for head in heads.heads for b in head]
    assert len({id(w) for w in blocks}) == 6
    # Own projections are trainable copies, not the target's tensor.
    assert heads.lm_heads[0].weight.data_ptr() != target.model.get_output_embeddings().weight.data_ptr()


@pytest.mark.parametrize("shared", [True, False])
def test_medusa_forward_of_the_first_heads_equals_each_head(target, shared):
    """forward(count) gives heads 1..count exactly as head_logits does one by one (the shared
    lm_head runs once over all heads' states)."""
    torch.manual_seed(3)
    heads = build_head(HeadSpec(kind="medusa", num_heads=3, shared_lm_head=shared), target)
    heads.bind(target.model)
    for block in heads.heads:
        block[0].linear.weight.data.normal_(0, 0.1)
    hidden = torch.randn(2, 5, target.hidden_size)
    both = heads(hidden, 2)
    assert both.shape == (2, 2, 5, target.vocab_size)
    for k in range(2):
        torch.testing.assert_close(both[k], heads.head_logits(k, hidden), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(both[0], both[1], atol=1e-3)
    assert heads(hidden).shape[0] == 3 and heads(hidden, 9).shape[0] == 3


def test_medusa_shared_lm_head_is_not_saved(target, tmp_path):
    heads = build_head(HeadSpec(kind="medusa", num_heads=2), target)
    assert not any("lm_head" in k for k in heads.state_dict())
    assert sum(p.numel() for p in heads.parameters()) == 2 * (64 * 64 + 64)


@pytest.mark.parametrize("shared", [True, False])
def test_medusa_draft_vocab_projects_onto_its_rows_only(target, shared, tmp_path):
    """draft_logits are the full logits at the draft ids (the same rows, so the same numbers);
    the maps are saved, and a full-vocabulary Medusa checkpoint has none (old ones still load)."""
    from headstart.heads import load_heads

    counts = torch.zeros(target.vocab_size)
    counts[[5, 9, 40, 100, 7]] = torch.tensor([10.0, 3.0, 8.0, 1.0, 3.0])
    spec = HeadSpec(kind="medusa", num_heads=3, shared_lm_head=shared, draft_vocab_size=4)
    heads = build_head(spec, target, token_counts=counts)
    for block in heads.heads:
        block[0].linear.weight.data.normal_(0, 0.1)
    assert heads.has_draft_vocab and heads.draft_ids().tolist() == [5, 7, 9, 40]
    hidden = torch.randn(2, 5, target.hidden_size)
    full, draft = heads(hidden, 2), heads.draft_logits(hidden, 2)
    assert draft.shape == (2, 2, 5, 4)
    torch.testing.assert_close(draft, full[..., [5, 7, 9, 40]], rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # decoding: the rows through the CPU kernel (smallmm.linear), same numbers
        torch.testing.assert_close(heads.draft_logits(hidden, 2), draft, rtol=1e-5, atol=1e-5)
    heads.save_pretrained(tmp_path / "vocab")
    again = load_heads(tmp_path / "vocab", target)
    assert again.draft_ids().tolist() == [5, 7, 9, 40]
    plain = build_head(HeadSpec(kind="medusa", num_heads=2, shared_lm_head=shared), target)
    assert not plain.has_draft_vocab and not any(k in plain.state_dict() for k in ("d2t", "t2d"))
    with pytest.raises(HeadstartError, match="full vocabulary"):
        plain.set_draft_vocab(torch.arange(4))


@pytest.mark.parametrize(
    "spec", [HeadSpec(kind="eagle"), HeadSpec(kind="eagle3"), HeadSpec(kind="eagle3", layout="fc")]
)
def test_eagle_head_cache_matches_full_forward(target, spec):
    head = build_head(spec, target)
    assert isinstance(head, EagleLike)
    torch.manual_seed(1)
    hidden, ids = torch.randn(2, 6, 64), torch.randint(0, target.vocab_size, (2, 6))
    pos = torch.arange(6).expand(2, 6)
    full = head(hidden, ids, position_ids=pos)
    assert full.shape == (2, 6, 64)
    assert head.logits(full).shape == (2, 6, target.vocab_size)
    cache = head.new_cache()
    first = head(hidden[:, :4], ids[:, :4], position_ids=pos[:, :4], past_key_values=cache)
    # Two tree nodes as siblings after the prefix: each sees the prefix and itself only.
    mask = tree_attention_mask(
        torch.ones(2, 4, dtype=torch.bool), torch.eye(2, dtype=torch.bool), torch.float32
    )
    second = head(
        hidden[:, 4:],
        ids[:, 4:],
        position_ids=torch.full((2, 2), 4),
        attention_mask=mask,
        past_key_values=cache,
    )
    torch.testing.assert_close(first, full[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[:, 0], full[:, 4], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(second[:, 1], full[:, 5], atol=1e-3)  # node 2 did not see node 1


def test_eagle3_draft_vocab_maps_and_fuse(target):
    counts = torch.zeros(target.vocab_size)
    counts[[5, 9, 40, 100, 7]] = torch.tensor([10.0, 3.0, 8.0, 1.0, 3.0])
    head = build_head(HeadSpec(kind="eagle3", draft_vocab_size=4), target, token_counts=counts)
    assert head.feature_layers == (0, 1, 1)  # 2-layer target: (0, L//2, L-1)
    assert (
        head.d2t.dtype == torch.long
        and head.t2d.dtype == torch.bool
        and head.t2d.shape == (target.vocab_size,)
    )
    assert head.draft_ids().tolist() == [5, 7, 9, 40]  # top-4 by count, ties by lower id
    assert head.draft_to_target(torch.arange(4)).tolist() == [5, 7, 9, 40]
    assert head.t2d.nonzero().flatten().tolist() == [5, 7, 9, 40]
    ids = torch.randint(0, target.vocab_size, (1, 5))
    feats = capture(target.model, ids, layers=head.feature_layers)
    h = head.fuse(feats.last_hidden, feats.layers)
    g = head(h, ids, position_ids=torch.arange(5)[None])
    assert head.logits(g).shape == (1, 5, 4)
    # The draft lm_head starts from the target's rows for those tokens.
    torch.testing.assert_close(
        head.lm_head.weight, target.model.get_output_embeddings().weight[[5, 7, 9, 40]]
    )


def test_head_spec_that_does_not_fit_the_target_fails_before_compute(llama_target):
    with pytest.raises(HeadstartError, match="draft_vocab_size=100000 exceeds"):
        build_head(HeadSpec(kind="eagle3", draft_vocab_size=100000), llama_target)
    with pytest.raises(HeadstartError, match="out of range"):
        build_head(HeadSpec(kind="eagle3", feature_layers=[0, 1, 7]), llama_target)
    with pytest.raises(HeadstartError, match="needs token counts"):
        build_head(HeadSpec(kind="eagle3", draft_vocab_size=10), llama_target)
    with pytest.raises(HeadstartError, match="not used by eagle"):
        build_head(HeadSpec(kind="eagle", draft_vocab_size=10), llama_target)
    with pytest.raises(HeadstartError, match="must name 3 target layers for eagle3"):
        HeadSpec(kind="eagle3", feature_layers=[0, 1])


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eagle_input_norms_balance_token_and_feature(target, kind, tmp_path):
    """With input norms (the default for new heads) the head's output does not change when the
    features are 500x larger (as SmolLM2's deep layers are against its embeddings), and the token
    still matters; a checkpoint saved without the field loads as a head without norms."""
    torch.manual_seed(0)
    head = build_head(HeadSpec(kind=kind, layout="fc"), target)  # the reference layout: below
    assert head.config.input_norms and head.embed_norm is not None
    h = torch.randn(1, 4, target.hidden_size)
    ids = torch.randint(0, target.vocab_size, (1, 4))
    pos = torch.arange(4)[None]
    base = head(h, ids, position_ids=pos)
    torch.testing.assert_close(head(500 * h, ids, position_ids=pos), base, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(head(500 * h, (ids + 1) % target.vocab_size, position_ids=pos), base, atol=1e-3)
    head.save_pretrained(tmp_path / "new")
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    del config["input_norms"]  # the format before the field existed
    old = HeadConfig(**config)
    assert not old.input_norms
    plain = type(head)(old)
    assert plain.embed_norm is None and not any(
        "norm" in n and "embed" in n for n, _ in plain.named_parameters()
    )


def test_eagle3_reference_layout_matches_the_release(target):
    """New EAGLE-3 heads have the reference layout: q/k/v over 2H, hidden_norm, fc 3H -> H without
    bias, and the attention's residual is g itself (not a projection of it)."""
    head = build_head(HeadSpec(kind="eagle3"), target)
    assert head.config.layout == "reference" and not head.config.input_norms
    hidden, layer = target.hidden_size, head.midlayer.layer
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    heads_dim = layer.self_attn.q_proj.out_features
    assert shapes["midlayer.layer.self_attn.q_proj.weight"] == (heads_dim, 2 * hidden)
    assert shapes["midlayer.layer.hidden_norm.weight"] == (hidden,)
    assert shapes["fc.weight"] == (hidden, 3 * hidden) and "fc.bias" not in shapes
    assert {"norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(shapes)
    assert not any(k.startswith(("fuse_fc", "embed_norm", "hidden_norm")) for k in shapes)
    # with zeroed attention output and MLP the layer is the identity on g: g is the residual
    torch.manual_seed(2)
    g, ids = torch.randn(1, 3, hidden), torch.randint(0, target.vocab_size, (1, 3))
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    torch.testing.assert_close(head(g, ids, position_ids=torch.arange(3)[None]), g)

"""The fc -> reference EAGLE-3 warm start (headstart.heads.relayout) on a tiny Llama target."""

from __future__ import annotations

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head
from headstart.heads.relayout import Scales, calibrate, reference_from_fc


def _heads(target, **fc_spec):
    torch.manual_seed(0)
    counts = torch.rand(target.vocab_size)
    spec = HeadSpec(kind="eagle3", layout="fc", draft_vocab_size=96, **fc_spec)
    fc = build_head(spec, target, token_counts=counts)
    with torch.no_grad():
        for param in fc.parameters():  # trained-looking weights: no norm left at 1, no zero bias
            param.add_(torch.randn_like(param) * 0.2)
    spec = HeadSpec(kind="eagle3", layout="reference", draft_vocab_size=96)
    ref = build_head(spec, target, token_counts=torch.rand(target.vocab_size))  # another vocabulary
    return fc, ref


def test_copies_what_the_layouts_share_and_maps_the_inputs(llama_target):
    fc, ref = _heads(llama_target)
    hidden = llama_target.hidden_size
    layers = torch.randn(12, 3 * hidden) * 30  # target features dwarf the embeddings
    e = torch.randn(12, hidden) * 0.05
    g = fc.fuse_fc(layers).detach()
    scales = calibrate(fc, g, e)
    reference_from_fc(fc, ref, scales)

    with torch.no_grad():
        a, b = fc.fc.weight[:, :hidden], fc.fc.weight[:, hidden:]
        x = fc.fc(torch.cat([fc.embed_norm(e), fc.hidden_norm(g)], dim=-1))
        feature_part = fc.hidden_norm(g) @ b.T
        rms = lambda t: t.pow(2).mean(-1, keepdim=True).sqrt()  # noqa: E731
        assert scales.s == pytest.approx(float((1 / rms(x)).mean()), rel=1e-4)
        assert scales.r == pytest.approx(float(rms(g).mean()), rel=1e-4)
        assert scales.rho == pytest.approx(float(rms(feature_part).mean()), rel=1e-4)
        # the reference's own g is the feature part of x, at its mean size
        g_ref = ref.fc(layers)
        torch.testing.assert_close(g_ref, feature_part * rms(g) / scales.r, rtol=1e-4, atol=1e-4)
        src, dst = fc.midlayer.layer, ref.midlayer.layer
        wide = torch.cat([dst.input_layernorm(e), dst.hidden_norm(g_ref)], dim=-1)
        # what the fc layer's projections read, each token's norm scale at the mean, no fc bias
        seen = (
            scales.s
            * src.input_layernorm.weight
            * (a @ fc.embed_norm(e).T + (feature_part * scales.rho / rms(feature_part)).T).T
        )
        for name in ("q_proj", "k_proj", "v_proj"):
            torch.testing.assert_close(getattr(dst.self_attn, name)(wide), getattr(src.self_attn, name)(seen),
                                       rtol=1e-4, atol=1e-4)  # fmt: skip
    same = ["lm_head.weight", "norm.weight", "d2t", "t2d", "midlayer.layer.mlp.down_proj.weight",
            "midlayer.layer.self_attn.o_proj.weight", "midlayer.layer.post_attention_layernorm.weight"]  # fmt: skip
    fc_state, ref_state = fc.state_dict(), ref.state_dict()
    assert all(torch.equal(fc_state[k], ref_state[k]) for k in same)


def test_heads_without_input_norms_are_refused(llama_target):
    fc, ref = _heads(llama_target, input_norms=False)
    with pytest.raises(HeadstartError, match="no input norms"):
        reference_from_fc(fc, ref, Scales(s=1.0, r=1.0, rho=1.0))

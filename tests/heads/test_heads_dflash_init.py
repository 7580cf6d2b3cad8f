"""DFlash's warm start (head.init_layers=target): the draft layer starts as the target layer after
the deepest tap, so the context's values are the target's own there; norms that compute otherwise
(Gemma's 1 + w) keep their fresh values; kinds without one refuse the option in one line."""

from __future__ import annotations

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head
from headstart.targets import capture, load_target
from headstart.targets.features import decoder_layers
from tests.tiny import FAMILIES, make_target_dir


@pytest.fixture(scope="module")
def llama(tiny_llama):
    return load_target(str(tiny_llama))


def test_draft_layer_starts_as_the_target_layer_after_the_deepest_tap(llama):
    head = build_head(HeadSpec(kind="dflash", num_layers=1, init_layers="target", feature_layers=[0]), llama)
    donor = decoder_layers(llama.model)[1]  # tap 0 is block 0's output: block 1 reads it
    mine = dict(head.layers[0].named_parameters())
    for name, param in donor.named_parameters():
        assert torch.equal(mine[name], param), name
    ids = llama.tokenizer("hello there, how are you", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        feats = capture(llama.model, ids, layers=[0])
        g = head.fuse(feats.last_hidden, feats.layers)
        # the draft's context values are the target's values at block 1 (its input norm, then v_proj)
        expected = donor.self_attn.v_proj(donor.input_layernorm(feats.layers[0]))
        assert torch.allclose(head.layers[0].self_attn.v_proj(g), expected, atol=1e-5)


def test_random_start_differs_and_is_the_default(llama):
    head = build_head(HeadSpec(kind="dflash", num_layers=1, feature_layers=[0]), llama)
    donor = decoder_layers(llama.model)[1]
    assert not torch.equal(head.layers[0].self_attn.q_proj.weight, donor.self_attn.q_proj.weight)


def test_gemma_norms_stay_fresh(tmp_path):
    gemma = load_target(str(make_target_dir(tmp_path, "gemma3_text", seed=3, **FAMILIES["gemma3_text"])))
    head = build_head(HeadSpec(kind="dflash", num_layers=1, init_layers="target", feature_layers=[1]), gemma)
    donor = decoder_layers(gemma.model)[2]
    assert torch.equal(head.layers[0].self_attn.q_proj.weight, donor.self_attn.q_proj.weight)
    assert torch.equal(head.layers[0].input_layernorm.weight, torch.ones_like(donor.input_layernorm.weight))
    assert torch.equal(head.hidden_norm.weight, torch.ones_like(head.hidden_norm.weight))


def test_other_kinds_refuse_it():
    for kind, layout in (("medusa", "fc"), ("eagle", "fc"), ("eagle3", "fc")):
        with pytest.raises(HeadstartError, match="no warm start from the target's layers"):
            HeadSpec(kind=kind, layout=layout, init_layers="target")
    HeadSpec(kind="eagle3", layout="reference", init_layers="target")  # EAGLE-3's reference layout has one
    with pytest.raises(HeadstartError, match="unknown head.init_layers"):
        HeadSpec(kind="dflash", init_layers="donor")


def test_no_donor_past_the_last_layer(llama):
    """The tiny target has layers 0 and 1: tapping layer 1 leaves no layer after it to copy."""
    with pytest.raises(HeadstartError, match="init_layers=target copies target layers 2..2"):
        build_head(HeadSpec(kind="dflash", num_layers=1, init_layers="target", feature_layers=[1]), llama)

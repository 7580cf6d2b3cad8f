"""EAGLE-3's warm start (head.init_layers=target, reference layout): the draft layer starts as the
target layer after the deepest tap, fc passes that tap and the embedding half of q/k/v is 0, so
at step 0 the head's logits are the target's early exit there (that layer, the final norm, the
draft vocabulary's rows of the lm_head)."""

from __future__ import annotations

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head
from headstart.targets import capture, load_target
from headstart.targets.features import decoder_layers
from tests.tiny import make_target_dir


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3-init")
    return load_target(str(make_target_dir(root, "llama", seed=5, num_hidden_layers=4)))


def spec(**extra):
    return HeadSpec(kind="eagle3", layout="reference", draft_vocab_size=0, feature_layers=[0, 1, 2], **extra)


def test_the_head_starts_as_the_targets_early_exit_after_the_deepest_tap(deep):
    head = build_head(spec(init_layers="target"), deep)
    donor = decoder_layers(deep.model)[3]  # tap 2 is block 2's output: block 3 reads it
    assert torch.equal(head.midlayer.layer.mlp.down_proj.weight, donor.mlp.down_proj.weight)
    ids = deep.tokenizer("hello there, how are you today", return_tensors="pt")["input_ids"]
    positions = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        feats = capture(deep.model, ids, layers=[0, 1, 2])
        g = head(head.fuse(feats.last_hidden, feats.layers), ids, position_ids=positions)
        drafted = head.logits(g)
        rotary = deep.model.model.rotary_emb(feats.layers[2], positions)
        out = donor(feats.layers[2], position_embeddings=rotary, position_ids=positions,
                    attention_mask=None)  # fmt: skip
        out = out[0] if isinstance(out, tuple) else out
        early_exit = deep.model.lm_head(deep.model.model.norm(out))
    torch.testing.assert_close(drafted, early_exit, atol=1e-4, rtol=1e-4)


def test_random_start_is_the_default_and_differs(deep):
    head = build_head(spec(), deep)
    donor = decoder_layers(deep.model)[3]
    assert not torch.equal(head.midlayer.layer.mlp.down_proj.weight, donor.mlp.down_proj.weight)


def test_no_donor_past_the_last_layer(deep):
    with pytest.raises(HeadstartError, match="init_layers=target copies target layers 4..4"):
        build_head(
            HeadSpec(kind="eagle3", draft_vocab_size=0, feature_layers=[0, 1, 3], init_layers="target"), deep
        )

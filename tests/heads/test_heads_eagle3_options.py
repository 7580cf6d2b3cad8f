"""EAGLE-3 head options (issue 49's ablations): EAGLE-3.1's norm on each tapped state before fc
(head.fc_norm), a Qwen3-style draft layer (head.draft_layer=qwen3: q/k norms), several draft
layers (head.num_layers). Each builds what it says, decodes exactly (greedy output equals the
target's generate, eagerly and compiled), round-trips where a format holds it and is refused in
one line where none does."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_heads_formats import _decode, _trained_like

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.heads import Eagle3Head, HeadSpec, build_head, load_heads
from headstart.heads.formats import export_heads
from headstart.inference.decoder import SpeculativeDecoder

OPTIONS = {
    "fc_norm": dict(fc_norm=True),
    "qwen3": dict(draft_layer="qwen3"),
    "layers2": dict(num_layers=2),
}


def _greedy_equals_generate(target, head, **decoder) -> None:
    for text in ("hello there", "count to ten and back"):
        ids = target.chat.user_prompt_ids(text)
        x = torch.tensor([ids])
        want = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
        got = SpeculativeDecoder(target, head, **decoder).generate(
            [ids], max_new_tokens=20, eos_token_id=None
        )
        assert got.token_ids[0] == want, text


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_builds_what_it_says_and_decodes_exactly(llama_target, name):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60, **OPTIONS[name]), llama_target)
    state = head.state_dict()
    if name == "fc_norm":
        assert [f"fc_norm.{i}.weight" in state for i in range(3)] == [True] * 3
        layers = {i: torch.randn(1, 5, llama_target.hidden_size) * (10.0**i) for i in head.feature_layers}
        normed = [norm(layers[i]) for norm, i in zip(head.fc_norm, head.feature_layers, strict=True)]
        torch.testing.assert_close(head.fuse(None, layers), head.fc(torch.cat(normed, -1)))
    if name == "qwen3":
        attn = head.midlayer.layer.self_attn
        assert type(head.midlayer.layer).__name__ == "Qwen3DecoderLayer" and hasattr(attn, "q_norm")
        assert attn.q_proj.in_features == 2 * llama_target.hidden_size
    if name == "layers2":
        assert (
            any(k.startswith("midlayer.more.0.") for k in state)
            and head.midlayer.config.num_hidden_layers == 2
        )
        assert head.midlayer.more[0].self_attn.q_proj.in_features == llama_target.hidden_size
    _greedy_equals_generate(llama_target, head)
    _greedy_equals_generate(llama_target, head, tree="chain:3")
    _greedy_equals_generate(llama_target, head, compile=True, compile_backend="aot_eager")


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_saves_and_loads_in_headstarts_format(llama_target, tmp_path, name):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60, **OPTIONS[name]), llama_target)
    loaded = load_heads(head.save_pretrained(tmp_path / name), llama_target)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    assert _decode(llama_target, loaded) == _decode(llama_target, head)


@pytest.mark.parametrize("name", ["fc_norm", "qwen3"])
def test_speculators_export_writes_the_option_and_imports_it_back(llama_target, tmp_path, name):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60, **OPTIONS[name]), llama_target)
    out = export_heads(head, "speculators", tmp_path / name, dtype="float32", verifier="org/tiny-llama")
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    assert config["fc_norm"] is (name == "fc_norm") and config["norm_before_fc"] is False
    assert ("fc_norm.2.weight" in weights) is (name == "fc_norm")
    assert config["transformer_layer_config"]["model_type"] == ("qwen3" if name == "qwen3" else "llama")
    loaded = load_heads(out, llama_target)
    assert isinstance(loaded, Eagle3Head) and loaded.config.fc_norm is (name == "fc_norm")
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    assert _decode(llama_target, loaded) == _decode(llama_target, head)


@pytest.mark.parametrize(
    "name,fmt,message",
    [
        ("fc_norm", "eagle", "no norms on the tapped states"),
        ("qwen3", "eagle", "qwen3"),
        ("layers2", "eagle", "1-layer"),
        ("layers2", "speculators", "1-layer"),
    ],
)
def test_formats_refuse_an_option_they_cannot_hold_in_one_line(llama_target, tmp_path, name, fmt, message):
    head = build_head(HeadSpec(kind="eagle3", **OPTIONS[name]), llama_target)
    with pytest.raises(HeadstartError, match=message):
        export_heads(head, fmt, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["head.kind=medusa", "head.fc_norm=true"],
            "head.fc_norm is an option of eagle3 heads, not of medusa heads",
        ),
        (["head.kind=eagle3", "head.layout=fc", "head.num_layers=2"], "head.num_layers is an option"),
        (["head.kind=eagle3", "head.draft_layer=gemma"], "must be one of"),
        (["head.kind=dflash", "head.draft_layer=qwen3"], "head.draft_layer is an option"),
        (
            ["head.kind=eagle3", "head.layout=tree"],
            "unknown head.layout 'tree' .fix: use head.layout=reference or fc",
        ),
    ],
)
def test_options_are_typed_and_refused_where_they_mean_nothing(overrides, message):
    from headstart.train.config import TrainConfig

    with pytest.raises(HeadstartError, match=message):
        load_config(TrainConfig, None, overrides)


def test_defaults_are_todays_head(llama_target):
    """Every option off builds the state dict of a head made before the options existed."""
    spec = HeadSpec(kind="eagle3")
    assert (spec.fc_norm, spec.draft_layer, spec.num_layers) == (False, "target", 1)
    head = build_head(spec, llama_target)
    assert not any(k.startswith(("fc_norm", "midlayer.more")) for k in head.state_dict())
    assert type(head.midlayer.layer).__name__ == "LlamaDecoderLayer" and not head.config.draft_config


def test_each_kind_builds_its_own_default_layout():
    """head.layout left out: the kind's first layout (HeadKind.heads), EAGLE-3's reference, "fc"
    for kinds with one; "reference" on another kind (every saved config held it, the old shared
    default) says nothing."""
    assert HeadSpec(kind="eagle3").layout == "reference" and HeadSpec(kind="medusa").layout == "fc"
    assert HeadSpec(kind="dflash", layout="reference").layout == "fc"
    assert HeadSpec(kind="eagle3", layout="fc").layout == "fc"

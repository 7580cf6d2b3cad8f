"""DFlash heads out to speculators' and z-lab's layouts and back: every field a reader needs,
the same weights, the same drafts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from headstart.errors import HeadstartError
from headstart.heads import HeadSpec, build_head, load_heads
from headstart.heads.dflash import DFlashHead
from headstart.heads.formats import detect_format, export_heads
from headstart.inference.decoder import SpeculativeDecoder


def _trained_like(target, vocab: int = 0, seed: int = 0):
    counts = torch.arange(target.vocab_size, dtype=torch.float32)
    head = build_head(HeadSpec(kind="dflash", block_size=6, num_layers=2, draft_vocab_size=vocab), target,
                      token_counts=counts, seed=seed)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return head


def _decode(target, head, tree="chain:4"):
    prompts = [target.chat.user_prompt_ids(p) for p in ("hello there", "count to ten")]
    out = SpeculativeDecoder(target, head, tree=tree).generate(prompts, max_new_tokens=16, eos_token_id=None)
    return out.token_ids, dict(out.stats.accept_lengths)


@pytest.mark.parametrize("fmt", ["speculators", "dflash"])
def test_dflash_export_import_round_trip(llama_target, tmp_path, fmt):
    head = _trained_like(llama_target)
    out = export_heads(head, fmt, tmp_path / fmt, dtype="float32", verifier="org/tiny-llama")
    assert detect_format(out) == fmt
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    hidden, layers = llama_target.hidden_size, head.feature_layers
    assert weights["fc.weight"].shape == (hidden, len(layers) * hidden)
    assert {"hidden_norm.weight", "norm.weight", "layers.1.self_attn.k_norm.weight"} <= set(weights)
    assert not any(k.startswith(("embed", "lm_head", "d2t", "t2d")) for k in weights)  # the target's, shared
    if fmt == "speculators":
        assert config["speculators_model_type"] == "dflash" and config["block_size"] == 6
        assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in layers]  # input of layer i + 1
        assert config["mask_token_id"] == head.mask_token_id and config["draft_vocab_size"] == 288
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
        assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
        layer = config["transformer_layer_config"]
    else:
        assert config["architectures"] == ["DFlashDraftModel"] and "speculators_model_type" not in config
        assert config["dflash_config"] == {"mask_token_id": head.mask_token_id,
                                           "target_layer_ids": list(layers), "block_size": 6}  # fmt: skip
        assert config["num_target_layers"] == 2 and "is_causal" not in config  # bidirectional block
        layer = config
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == 2
    assert set(layer["layer_types"]) == {"full_attention"} and layer["use_sliding_window"] is False
    loaded = load_heads(out, llama_target)
    assert isinstance(loaded, DFlashHead) and loaded.feature_layers == layers
    assert loaded.block_size == 6 and loaded.mask_token_id == head.mask_token_id
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    assert _decode(llama_target, loaded) == _decode(llama_target, head)


def test_a_draft_vocabulary_goes_out_whole_to_z_lab_and_as_is_to_speculators(llama_target, tmp_path, caplog):
    """z-lab's layout (llama.cpp's reader) has no draft vocabulary: the export is full-vocabulary
    and says engines may draft less well (tokens outside it were never trained down); the
    imported head drafts over every token. speculators' layout keeps it as speculators saves one
    (`lm_head.weight`: the target lm_head's rows, `d2t`, `t2d`), and the head comes back with the
    same drafts. Greedy output is `generate`'s every way."""
    head = _trained_like(llama_target, vocab=60)
    out = export_heads(head, "dflash", tmp_path / "x", dtype="float32")
    assert "drafts over 60 of" in caplog.text
    assert "d2t" not in load_file(str(out / "model.safetensors"))
    loaded = load_heads(out, llama_target)
    assert not loaded.has_draft_vocab
    reference = llama_target.model.generate(
        torch.tensor([llama_target.chat.user_prompt_ids("hello there")]), max_new_tokens=16, do_sample=False
    )
    got = SpeculativeDecoder(llama_target, loaded).generate(
        [llama_target.chat.user_prompt_ids("hello there")], max_new_tokens=16, eos_token_id=None
    )
    assert got.token_ids[0] == reference[0, -16:].tolist()
    caplog.clear()
    for dtype in ("float32", "bfloat16"):
        out = export_heads(head, "speculators", tmp_path / dtype, dtype=dtype)
        assert "drafts over" not in caplog.text
        config = json.loads((out / "config.json").read_text())
        weights = load_file(str(out / "model.safetensors"))
        assert config["draft_vocab_size"] == 60 and weights["lm_head.weight"].shape == (
            60,
            llama_target.hidden_size,
        )
        assert torch.equal(weights["d2t"] + torch.arange(60), head.draft_ids()) and weights["t2d"].sum() == 60
        loaded = load_heads(out, llama_target)
        assert loaded.has_draft_vocab and torch.equal(loaded.draft_ids(), head.draft_ids())
        if dtype == "float32":
            assert _decode(llama_target, loaded) == _decode(llama_target, head)  # the same drafts


def test_dflash_formats_refuse_other_heads_and_other_heads_refuse_dflash(llama_target, tmp_path):
    eagle3 = build_head(HeadSpec(kind="eagle3"), llama_target)
    with pytest.raises(HeadstartError, match="holds DFlash block drafters, not eagle3"):
        export_heads(eagle3, "dflash", tmp_path / "x")
    head = _trained_like(llama_target)
    for fmt in ("eagle", "medusa"):
        with pytest.raises(HeadstartError):
            export_heads(head, fmt, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c, w: c["dflash_config"].update(target_layer_ids=[0, 7]), "reads target layers"),
        (lambda c, w: c.update(hidden_size=32), "hidden size 32"),
        (lambda c, w: c.update(model_type="llama"), "llama draft layers"),
        (lambda c, w: w.pop("layers.1.mlp.up_proj.weight"), "missing"),
        (lambda c, w: w.update(d2t=torch.zeros(3, dtype=torch.long)), "incomplete draft vocabulary"),
        (lambda c, w: w.update(**{"lm_head.weight": torch.randn(288, 64)}), "lm_head of its own"),
        (lambda c, w: c["dflash_config"].update(mask_token_id=10**6), "mask token"),
        # z-lab's newer drafts mix sliding layers (causal in the block, windowed context)
        (
            lambda c, w: c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=8),
            "sliding-window draft layers",
        ),
    ],
)
def test_damaged_dflash_checkpoints_fail_in_one_line(llama_target, tmp_path, edit, message):
    out = export_heads(_trained_like(llama_target), "dflash", tmp_path / "x", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    edit(config, weights)
    (out / "config.json").write_text(json.dumps(config))
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(HeadstartError, match=message) as err:
        load_heads(out, llama_target)
    assert "\n" not in err.value.one_line()


def test_feature_layers_must_increase(llama_target):
    """vLLM gathers the aux states walking the layers upward, once each: [4, 1, 2] would feed an
    exported head's fc its blocks permuted, [2, 2, 4] too few of them."""
    for layers in ([4, 1, 2], [2, 2, 4]):
        with pytest.raises(HeadstartError, match="must be increasing"):
            HeadSpec(kind="dflash", feature_layers=layers)


def test_a_draft_vocabulary_export_loads_into_the_target_at_another_dtype(llama_target, tiny_llama, tmp_path):
    """The exported lm_head rows are the target's rounded to the export's dtype: a target loaded in
    bf16 or float16 reads them back (equal within the coarser rounding), and a d2t of the wrong
    length is one line."""
    from headstart.targets import load_target

    head = _trained_like(llama_target, vocab=60)
    for dtype in ("float32", "bfloat16"):
        out = export_heads(head, "speculators", tmp_path / dtype, dtype=dtype)
        for loaded_as in ("bfloat16", "float16"):
            other = load_target(str(tiny_llama), dtype=loaded_as)
            assert load_heads(out, other).has_draft_vocab, (dtype, loaded_as)
    weights = load_file(str(out / "model.safetensors"))
    weights["d2t"] = weights["d2t"][:-1]
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(HeadstartError, match="incomplete draft vocabulary") as err:
        load_heads(out, llama_target)
    assert "\n" not in err.value.one_line()

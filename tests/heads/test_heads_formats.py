"""Export to the serving engines' formats and import of published heads (headstart.heads.formats)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from headstart.errors import HeadstartError
from headstart.heads import Eagle3Head, HeadSpec, MedusaHeads, build_head, load_heads
from headstart.heads.formats import detect_format, export_heads
from headstart.inference.decoder import SpeculativeDecoder


def _trained_like(spec: HeadSpec, target, seed: int = 0):
    """A head with weights away from their init, so a lost tensor shows."""
    counts = torch.arange(target.vocab_size, dtype=torch.float32)
    head = build_head(spec, target, token_counts=counts, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return head


def _decode(target, head, tree="static"):
    prompts = [target.chat.user_prompt_ids(p) for p in ("hello there", "count to ten")]
    out = SpeculativeDecoder(target, head, tree=tree).generate(prompts, max_new_tokens=16, eos_token_id=None)
    return out.token_ids, dict(out.stats.accept_lengths)


@pytest.mark.parametrize("fmt", ["speculators", "eagle"])
@pytest.mark.parametrize("draft_vocab", [0, 60])
def test_eagle3_export_import_round_trip_decodes_identically(llama_target, tmp_path, fmt, draft_vocab):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=draft_vocab), llama_target)
    out = export_heads(head, fmt, tmp_path / fmt, dtype="float32", verifier="org/tiny-llama")
    assert detect_format(out) == fmt
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    layer = "layers.0." if fmt == "speculators" else "midlayer."
    hidden = llama_target.hidden_size
    assert weights[f"{layer}self_attn.q_proj.weight"].shape[1] == 2 * hidden
    assert weights["fc.weight"].shape == (hidden, 3 * hidden)
    assert f"{layer}hidden_norm.weight" in weights and f"{layer}input_layernorm.weight" in weights
    assert not any("rotary" in k or "embed" in k for k in weights)  # the target's embeddings are shared
    assert config["norm_before_residual"] is False
    aux = (
        config.get("eagle_aux_hidden_state_layer_ids")
        or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    )
    assert aux == [i + 1 for i in head.feature_layers]  # engines: id i = the input of layer i
    if draft_vocab:
        assert config["draft_vocab_size"] == 60 and weights["lm_head.weight"].shape == (60, hidden)
        d2t = weights["d2t"]
        assert (torch.arange(60) + d2t).tolist() == head.draft_ids().tolist()  # offsets
        assert weights["t2d"].dtype == torch.bool and int(weights["t2d"].sum()) == 60
    if fmt == "speculators":
        assert config["speculators_model_type"] == "eagle3"
        assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
        assert config["transformer_layer_config"]["num_hidden_layers"] == 1
        assert ("d2t" in weights) == bool(draft_vocab)  # speculators keeps no maps for a full vocabulary
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    loaded = load_heads(out, llama_target)
    assert isinstance(loaded, Eagle3Head) and loaded.feature_layers == head.feature_layers
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    assert _decode(llama_target, loaded) == _decode(llama_target, head)


def test_bf16_export_is_the_default_and_decodes_exactly(llama_target, tmp_path):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60), llama_target)
    out = export_heads(head, "speculators", tmp_path / "bf16")
    weights = load_file(str(out / "model.safetensors"))
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == torch.int64
    loaded = load_heads(out, llama_target)
    ids = [llama_target.chat.user_prompt_ids("hello there")]
    reference = llama_target.model.generate(
        torch.tensor(ids), attention_mask=torch.ones(1, len(ids[0]), dtype=torch.long), max_new_tokens=24,
        do_sample=False, eos_token_id=None, pad_token_id=0,
    )[0, len(ids[0]) :].tolist()  # fmt: skip
    got = SpeculativeDecoder(llama_target, loaded).generate(ids, max_new_tokens=24, eos_token_id=None)
    assert got.token_ids[0] == reference


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_headstart_format_reexports_at_another_dtype(llama_target, tmp_path, kind):
    """How the shipped heads become bf16: the same checkpoint (config, card, metadata), weights cast."""
    head = _trained_like(HeadSpec(kind=kind, draft_vocab_size=60), llama_target)
    head.config.training = {"steps": 7, "metrics": {"eval/top1/step0": 0.5}}
    out = export_heads(head, "headstart", tmp_path / "own")
    assert detect_format(out) == "headstart"
    weights = load_file(str(out / "model.safetensors"))
    assert {k for k, v in weights.items() if v.is_floating_point()} == {
        k for k, v in head.state_dict().items() if v.is_floating_point()
    }
    assert all(v.dtype == torch.bfloat16 for v in weights.values() if v.is_floating_point())
    assert "eval/top1/step0" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["training"]["steps"] == 7
    loaded = load_heads(out, llama_target)
    for key, value in head.state_dict().items():
        expected = value.to(torch.bfloat16).to(value.dtype) if value.is_floating_point() else value
        torch.testing.assert_close(loaded.state_dict()[key], expected, rtol=0, atol=0)
    ids = [llama_target.chat.user_prompt_ids("hello there")]
    reference = llama_target.model.generate(
        torch.tensor(ids), attention_mask=torch.ones(1, len(ids[0]), dtype=torch.long), max_new_tokens=24,
        do_sample=False, eos_token_id=None, pad_token_id=0,
    )[0, len(ids[0]) :].tolist()  # fmt: skip
    got = SpeculativeDecoder(llama_target, loaded).generate(ids, max_new_tokens=24, eos_token_id=None)
    assert got.token_ids[0] == reference


@pytest.mark.parametrize("shared", [True, False])
def test_medusa_export_import_round_trip(llama_target, tmp_path, shared):
    head = _trained_like(
        HeadSpec(kind="medusa", num_heads=3, shared_lm_head=shared, draft_vocab_size=50), llama_target
    )
    out = export_heads(head, "medusa", tmp_path / "medusa", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))
    assert (
        config["model_type"] == "medusa" and config["num_heads"] == 3 and config["truncated_vocab_size"] == 50
    )
    assert config["original_lm_head"] is shared and ("lm_head.weight" in weights) is shared
    assert weights["blocks.2.layers.0.weight"].shape == (llama_target.hidden_size,) * 2
    assert weights["token_map"].tolist() == head.draft_ids().tolist()
    loaded = load_heads(out, llama_target)
    assert isinstance(loaded, MedusaHeads) and loaded.config.shared_lm_head is shared
    hidden = torch.randn(1, 4, llama_target.hidden_size)
    torch.testing.assert_close(loaded.draft_logits(hidden), head.draft_logits(hidden), rtol=0, atol=0)
    assert _decode(llama_target, loaded) == _decode(llama_target, head)
    # a community checkpoint: the base model's config (its own num_hidden_layers) plus medusa_* keys
    config.update(num_hidden_layers=llama_target.config.num_hidden_layers + 5, medusa_num_heads=3,
                  medusa_num_layers=config["num_hidden_layers"])  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    assert load_heads(out, llama_target).config.num_heads == 3


def test_other_speculators_types_are_named_not_read_as_eagle3(tmp_path):
    """peagle, dflash2 and speculators' eagle have a draft_vocab_size too: they were taken for the
    EAGLE-3 release layout and failed on its missing fields."""
    for kind in ("peagle", "dflash2", "eagle"):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text(
            json.dumps({"speculators_model_type": kind, "draft_vocab_size": 32})
        )
        with pytest.raises(HeadstartError, match=f"a speculators '{kind}' head"):
            detect_format(folder)


def test_a_release_style_eagle3_checkpoint_loads(llama_target, tmp_path):
    """The EAGLE release ships pytorch_model.bin with midlayer.* names: read with weights_only
    (no pickled code runs)."""
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60), llama_target)
    out = export_heads(head, "eagle", tmp_path / "release", dtype="float32")
    weights = load_file(str(out / "model.safetensors"))
    (out / "model.safetensors").unlink()
    torch.save(weights, out / "pytorch_model.bin")
    loaded = load_heads(out, llama_target)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)


def test_exports_refuse_what_the_format_cannot_hold(llama_target, tmp_path):
    fc = build_head(HeadSpec(kind="eagle3", layout="fc"), llama_target)
    with pytest.raises(HeadstartError, match="reference layout") as err:
        export_heads(fc, "speculators", tmp_path / "x")
    assert "retrain" in err.value.fix
    medusa = build_head(HeadSpec(kind="medusa"), llama_target)
    with pytest.raises(HeadstartError, match="EAGLE-3 heads"):
        export_heads(medusa, "eagle", tmp_path / "x")
    with pytest.raises(HeadstartError, match="Medusa heads"):
        export_heads(build_head(HeadSpec(kind="eagle3"), llama_target), "medusa", tmp_path / "x")
    with pytest.raises(HeadstartError, match="unknown head format"):
        export_heads(medusa, "onnx", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_qwen2_layers_are_not_exported_as_llama(qwen2_target, tmp_path):
    head = build_head(HeadSpec(kind="eagle3"), qwen2_target)
    with pytest.raises(HeadstartError, match="qwen2"):
        export_heads(head, "eagle", tmp_path / "q")


def _exported(llama_target, tmp_path, fmt="speculators"):
    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60), llama_target)
    return export_heads(head, fmt, tmp_path / fmt, dtype="float32")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["transformer_layer_config"].update(hidden_size=96), "hidden size 96"),
        (lambda c: c["transformer_layer_config"].update(vocab_size=7), "vocabulary 7"),
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 40]), "taps target layers"),
        (lambda c: c.update(norm_before_residual=True), "norm_before_residual"),
    ],
)
def test_mismatched_published_heads_fail_with_one_line(llama_target, tmp_path, edit, message):
    out = _exported(llama_target, tmp_path)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadstartError, match=message):
        load_heads(out, llama_target)


def test_damaged_weights_and_configs_fail_with_one_line(llama_target, tmp_path):
    out = _exported(llama_target, tmp_path)
    weights = load_file(str(out / "model.safetensors"))
    weights["fc.weight"] = weights["fc.weight"][:, :10].contiguous()
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(HeadstartError, match="shape of fc.weight"):
        load_heads(out, llama_target)
    data = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(HeadstartError, match="damaged or truncated"):
        load_heads(out, llama_target)
    (out / "config.json").write_text("{not json")
    with pytest.raises(HeadstartError, match="not valid JSON"):
        load_heads(out, llama_target)
    (out / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(HeadstartError, match="not a head checkpoint"):
        load_heads(out, llama_target)


def test_export_cli_writes_a_loadable_directory(tiny_llama, llama_target, tmp_path, capsys):
    from headstart.cli import main

    head = _trained_like(HeadSpec(kind="eagle3", draft_vocab_size=60), llama_target)
    saved = head.save_pretrained(tmp_path / "final")
    out = tmp_path / "served" / "eagle"
    args = ["export", str(saved), "--format", "eagle", "--output", str(out), "--target", str(tiny_llama)]
    assert main(args) == 0
    assert "exported eagle3 heads" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mode & 0o044  # readable by a serving process
    loaded = load_heads(out, llama_target)
    assert _decode(llama_target, loaded) == _decode(llama_target, load_heads(saved, llama_target))
    assert (
        main(
            [
                "export",
                str(saved),
                "--format",
                "medusa",
                "--output",
                str(tmp_path / "m"),
                "--target",
                str(tiny_llama),
            ]
        )
        == 2
    )
    assert "Medusa heads" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_heads_argument_resolution(tmp_path, monkeypatch):
    """Directories are used as they are; a Hub id is downloaded (bench and generate alike); a
    file or a path-like name that does not exist is a local error, not a network one."""
    import huggingface_hub

    from headstart.heads.resolve import resolve_heads

    assert resolve_heads(tmp_path) == tmp_path
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(HeadstartError, match="is a file"):
        resolve_heads(tmp_path / "config.json")
    with pytest.raises(HeadstartError, match="no such directory"):
        resolve_heads(str(tmp_path / "nope"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id: str(tmp_path))
    assert resolve_heads("org/heads") == tmp_path


def test_a_trained_draft_model_exports_as_a_plain_transformers_directory(llama_target, tmp_path):
    """`--format transformers`: the draft_model head as a model directory with the target's
    tokenizer; transformers loads it as a causal LM with the head's own logits, `--draft-model DIR`
    drafts with it exactly, and reading it back as heads is refused in one line."""
    from transformers import AutoModelForCausalLM

    from headstart.drafts import load_draft_model

    head = _trained_like(HeadSpec(kind="draft_model", num_layers=1), llama_target)
    out = export_heads(head, "transformers", tmp_path / "draft", dtype="float32", verifier="org/tiny-llama",
                       tokenizer=llama_target.tokenizer)  # fmt: skip
    assert detect_format(out) == "transformers" and (out / "tokenizer_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([llama_target.chat.user_prompt_ids("hello there")])
    torch.testing.assert_close(model(ids).logits, head.logits(head(ids)))
    prompts = [llama_target.chat.user_prompt_ids(p) for p in ("hello there", "count to ten")]
    draft = load_draft_model(str(out), llama_target)
    out_ids = SpeculativeDecoder(llama_target, draft, tree="chain:3").generate(
        prompts, max_new_tokens=16, eos_token_id=None
    )
    plain = SpeculativeDecoder(llama_target, None).generate(prompts, max_new_tokens=16, eos_token_id=None)
    assert out_ids.token_ids == plain.token_ids
    with pytest.raises(HeadstartError, match="is a plain transformers model, not heads"):
        load_heads(out, llama_target)
    with pytest.raises(HeadstartError, match="holds a draft model"):
        export_heads(_trained_like(HeadSpec(kind="medusa"), llama_target), "transformers", tmp_path / "x",
                     tokenizer=llama_target.tokenizer)  # fmt: skip
    assert not (tmp_path / "x").exists()

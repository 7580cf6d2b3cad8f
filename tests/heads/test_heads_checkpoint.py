"""save_pretrained / from_pretrained / load_heads / push_to_hub round trips and refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from unittest import mock

import pytest
import torch

from headstart.errors import HeadstartError
from headstart.heads import Eagle3Head, HeadSpec, MedusaHeads, build_head, load_heads


def _perturb(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.01)


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_round_trip_gives_identical_outputs(kind, llama_target, tmp_path):
    counts = torch.arange(llama_target.vocab_size, dtype=torch.float32)
    spec = HeadSpec(kind=kind, draft_vocab_size=50 if kind == "eagle3" else 0)
    head = build_head(spec, llama_target, token_counts=counts)
    _perturb(head)
    head.config.training = {"data": "tiny", "steps": 3, "metrics": {"top1/step0": 0.5}}
    path = head.save_pretrained(tmp_path / kind)
    assert sorted(p.name for p in path.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    card = (path / "README.md").read_text()
    assert "steps: 3" in card and "top1/step0 | 0.5000" in card
    assert f"`{Path(llama_target.spec).name}`" in card and str(llama_target.spec) not in card  # no local path
    loaded = load_heads(path, llama_target)
    assert type(loaded) is type(head)
    ids = torch.randint(0, llama_target.vocab_size, (1, 5))
    hidden = torch.randn(1, 5, 64)
    if kind == "medusa":
        torch.testing.assert_close(loaded(hidden), head(hidden))
    else:
        pos = torch.arange(5)[None]
        torch.testing.assert_close(
            loaded.logits(loaded(hidden, ids, position_ids=pos)),
            head.logits(head(hidden, ids, position_ids=pos)),
        )
    if kind == "eagle3":
        assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)


def test_loading_onto_another_target_names_both(llama_target, qwen2_target, tmp_path):
    path = build_head(HeadSpec(kind="medusa"), llama_target).save_pretrained(tmp_path / "m")
    with pytest.raises(HeadstartError) as err:
        load_heads(path, qwen2_target)
    assert "tiny-llama" in err.value.what and "tiny-qwen2" in err.value.what
    with pytest.raises(HeadstartError, match="not eagle3"):
        Eagle3Head.from_pretrained(path)
    assert isinstance(MedusaHeads.from_pretrained(path), MedusaHeads)  # no target: no check, unbound


def test_resave_replaces_atomically_and_bad_dirs_fail(llama_target, tmp_path):
    head = build_head(HeadSpec(kind="medusa"), llama_target)
    head.save_pretrained(tmp_path / "h")
    head.config.training = {"steps": 9}
    head.save_pretrained(tmp_path / "h")
    assert json.loads((tmp_path / "h" / "config.json").read_text())["training"] == {"steps": 9}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]
    with pytest.raises(HeadstartError, match="config.json missing"):
        load_heads(tmp_path / "nothing")


def test_push_to_hub_uploads_the_saved_folder(llama_target):
    head = build_head(HeadSpec(kind="eagle"), llama_target)
    seen = {}

    def upload_folder(**kwargs):
        from pathlib import Path

        seen["files"] = sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())
        seen["repo"] = kwargs["repo_id"]
        return mock.Mock(commit_url="https://hf.co/me/head/commit/1")

    with mock.patch("huggingface_hub.hub_mixin.HfApi") as api_cls:
        api_cls.return_value.upload_folder.side_effect = upload_folder
        api_cls.return_value.create_repo.return_value.repo_id = "me/head"  # the Hub's canonical id
        url = head.push_to_hub("me/head", token="x")
    api_cls.return_value.create_repo.assert_called_once()
    assert seen == {"files": ["README.md", "config.json", "model.safetensors"], "repo": "me/head"}
    assert str(getattr(url, "commit_url", url)).endswith("/commit/1")


def test_model_card_metadata_comes_from_training(llama_target, tmp_path):
    """huggingface_hub's ModelCard: base_model for Hub targets, Hub datasets among the prompt
    sources (local files stay in the text only), metrics with their held-out values."""
    from huggingface_hub import ModelCard

    head = build_head(HeadSpec(kind="medusa"), llama_target)
    head.config.target = dict(head.config.target, kind="hub", name="org/target-model")
    head.config.training = {"data": "runs/d (10 conversations)", "steps": 5,
                            "datasets": ["Aeala/ShareGPT_Vicuna_unfiltered", str(tmp_path)],
                            "metrics": {"eval/top1/step0": 0.25, "eval/predictions": 40}}  # fmt: skip
    card = ModelCard.load(head.save_pretrained(tmp_path / "h") / "README.md")
    meta = card.data.to_dict()
    assert meta["base_model"] == "org/target-model" and meta["library_name"] == "headstart"
    assert meta["datasets"] == ["Aeala/ShareGPT_Vicuna_unfiltered"]
    assert meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "text-generation"
    results = {(r.metric_type, r.metric_name): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("predictions", "eval/predictions"): 40,
        ("accuracy", "top-1 draft accuracy at draft depth 1"): 0.25,
    }
    assert str(tmp_path) not in card.text and f".../{tmp_path.parent.name}/{tmp_path.name}" in card.text
    assert "training steps: 5" in card.text


def test_a_config_holds_its_kinds_own_fields_and_reads_older_files(llama_target, tmp_path):
    """config.json: the shared fields and the kind's own section (HeadKind.config_section), one
    flat mapping without other kinds' fields; a file written before the sections (every kind's
    fields, the others at their defaults) reads as before; another kind's field away from its
    default, or a Medusa head count no head has, is one line naming the file."""
    from headstart.heads.config import HeadConfig

    head = build_head(HeadSpec(kind="medusa", num_heads=2), llama_target)
    path = head.save_pretrained(tmp_path / "m")
    saved = json.loads((path / "config.json").read_text())
    assert saved["num_heads"] == 2 and saved["shared_lm_head"] is True
    assert not {"block_size", "mask_token_id", "input_norms", "fc_norm", "own_embeddings", "draft_from",
                "draft_config", "options"} & set(saved)  # fmt: skip
    assert "heads 2, layers 1" in (path / "README.md").read_text()
    as_saved = HeadConfig.read(path)
    older = saved | {"input_norms": False, "fc_norm": False, "own_embeddings": False, "block_size": 0,
                     "mask_token_id": -1, "draft_from": "", "draft_config": {}}  # fmt: skip
    (path / "config.json").write_text(json.dumps(older))
    assert HeadConfig.read(path) == as_saved and load_heads(path, llama_target).config.num_heads == 2
    for damage, message in (({"block_size": 8}, "block_size=8 is a field of dflash heads, not of this medusa head"),
                            ({"draft_config": {"model_type": "qwen3"}}, "is a field of eagle3 and dflash and draft_model heads"),
                            ({"num_heads": 500}, "num_heads is 500: Medusa heads number 1 to 64"),
                            ({"shared_lm_head": "sure"}, "'shared_lm_head in .*' must be true or false")):  # fmt: skip
        (path / "config.json").write_text(json.dumps(saved | damage))
        with pytest.raises(HeadstartError, match=message) as err:
            HeadConfig.read(path)
        assert str(path / "config.json") in err.value.what
    with pytest.raises(AttributeError, match="medusa heads have no 'block_size'"):
        _ = head.config.block_size
    with pytest.raises(TypeError, match="in options or as keywords, not both"):
        dataclasses.replace(head.config, num_heads=4)  # would be silently dropped

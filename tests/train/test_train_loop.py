"""The accelerate loop in-process on a tiny target: losses fall, metrics and checkpoints appear,
the final head loads back with its model card."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_data import self_distilled

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.heads import load_heads
from headstart.train.config import TrainConfig
from headstart.train.loop import train

KINDS = {
    "medusa": ["head.kind=medusa", "head.num_heads=2"],
    "eagle": ["head.kind=eagle", "loss.eval_steps=2"],
    "eagle3": ["head.kind=eagle3", "head.draft_vocab_size=96", "loss.ttt_steps=3"],
    "dflash": ["head.kind=dflash", "head.block_size=4", "head.draft_vocab_size=96", "loss.dflash_anchors=8"],
    "draft_model": ["head.kind=draft_model", "head.num_layers=1"],
    "medusa2": [
        "head.kind=medusa",
        "head.num_heads=2",
        "lora.enabled=true",
        "lora.warmup_steps=5",
        "lora.r=4",
    ],
}


def _cfg(target_dir, out, *extra):
    base = [
        f"target={target_dir}",
        f"output_dir={out}",
        "max_steps=30",
        "eval_every=15",
        "log_every=5",
        "save_every=10",
        "keep_last=1",
        "batch_size=4",
        "optim.lr=5e-3",
        "optim.schedule=constant",
        "data.holdout=4",
    ]
    return load_config(TrainConfig, None, [*base, *extra])


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "dflash", "draft_model"])
def test_training_lowers_the_loss_and_writes_a_loadable_head(kind, target, tmp_path, caplog):
    data = self_distilled(target, count=20)
    caplog.set_level("INFO", logger="headstart")
    summary = train(
        _cfg(target.spec, tmp_path, *KINDS[kind], "trackers=[tensorboard]"), data=data, target=target
    )
    losses = [h["loss"] for h in summary["history"] if h["kind"] == "train"]
    # EAGLE-3's soft CE is bounded below by the target's entropy, so it falls less in relative terms.
    assert len(losses) == 6 and losses[-1] < (0.92 if kind in ("eagle3", "dflash") else 0.85) * losses[0], (
        losses
    )
    final = summary["final_eval"]
    top1 = [v for k, v in final.items() if k.startswith("eval/top1/")]
    assert len(top1) == {"medusa": 2, "eagle": 2, "eagle3": 3, "dflash": 3, "draft_model": 1}[kind] and all(
        0 <= v <= 1 for v in top1
    )
    assert final["eval/accept_len_est"] >= 1.0 and final["eval/predictions"] > 0
    # by context position: the short held-out conversations lie in the first bucket, all of them
    assert final["eval/by_position"]["0-256"]["predictions"] == final["eval/predictions"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval step")]
    assert [m.split(":")[0] for m in said] == ["eval step 15", "eval step 30"]  # as they came
    assert f"accept_len_est {final['eval/accept_len_est']:.3f}" in said[-1]
    assert summary["tokens"] == 30 * 4 * 32 and summary["tokens_per_s"] > 0 and summary["peak_rss_mb"] > 0
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [
        "step-00000030"
    ]  # keep_last=1: the last step's, which `--resume max_steps=MORE` goes on from
    assert list((tmp_path / "logs").rglob("events.out.tfevents.*")), "tensorboard wrote nothing"
    head = load_heads(summary["final"], target)
    card = (tmp_path / "final" / "README.md").read_text()
    assert "training steps: 30" in card and "eval/top1/" in card
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == 30
    assert head.kind == kind


def test_medusa2_trains_lora_jointly_after_warmup(tiny_root, tmp_path):
    from tiny import make_target_dir

    from headstart.targets import load_target

    fresh = load_target(str(make_target_dir(tiny_root, "llama", seed=3)))  # peft edits the model in place
    before = {n: p.clone() for n, p in fresh.model.named_parameters()}
    summary = train(
        _cfg(fresh.spec, tmp_path, *KINDS["medusa2"], "trackers=[none]"),
        data=self_distilled(fresh, count=20),
        target=fresh,
    )
    logged = [h for h in summary["history"] if h["kind"] == "train"]
    first, last = logged[0], logged[-1]  # steps 1-5: warm-up (heads only); then the joint loss
    torch.testing.assert_close(
        first["loss"], first["train/ce/head1"] + 0.8 * first["train/ce/head2"], rtol=1e-4, atol=1e-4
    )
    joint = last["train/lm_loss"] + 0.2 * (last["train/ce/head1"] + 0.8 * last["train/ce/head2"])
    torch.testing.assert_close(last["loss"], joint, rtol=1e-4, atol=1e-4)
    adapter = tmp_path / "final-lora"
    assert (adapter / "adapter_config.json").is_file() and (tmp_path / "final" / "config.json").is_file()
    # the base weights never change: only the adapters (zero-initialised B) and the heads train
    lora_b = [p for n, p in fresh.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)
    for name, param in fresh.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, before[name.replace(".base_layer", "")]), name


def test_init_from_continues_from_saved_heads(target, tmp_path):
    """A run with init_from starts from the saved weights (and EAGLE-3 draft vocabulary): at lr 0
    it saves them back unchanged, and its first loss is the earlier run's trained loss, not a fresh
    head's."""
    from safetensors.torch import load_file

    data = self_distilled(target, count=20)
    eagle3 = KINDS["eagle3"]
    first = train(_cfg(target.spec, tmp_path / "a", *eagle3, "trackers=[none]"), data=data, target=target)
    again = _cfg(target.spec, tmp_path / "b", *eagle3, "trackers=[none]", f"init_from={first['final']}")
    again.max_steps, again.optim.lr, again.eval_every, again.log_every = 5, 0.0, 5, 1
    second = train(again, data=data, target=target)
    before = load_file(str(tmp_path / "a" / "final" / "model.safetensors"))
    after = load_file(str(tmp_path / "b" / "final" / "model.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    losses = lambda s: [h["loss"] for h in s["history"] if h["kind"] == "train"]  # noqa: E731
    assert losses(second)[0] < 0.95 * losses(first)[0], (losses(first), losses(second))
    assert "init_from" in (tmp_path / "b" / "final" / "README.md").read_text()


def test_init_from_fc_layout_warm_starts_a_reference_head(target, tmp_path):
    """init_from an fc-layout EAGLE-3 head into a reference-layout recipe: the warm start
    (headstart.heads.relayout) keeps the draft vocabulary and starts well below a fresh head's
    loss; the model card says where it came from."""
    data = self_distilled(target, count=20)
    eagle3 = KINDS["eagle3"]
    fc = train(_cfg(target.spec, tmp_path / "fc", *eagle3, "head.layout=fc", "trackers=[none]"),
               data=data, target=target)  # fmt: skip
    short = ["trackers=[none]", "max_steps=3", "log_every=1", "eval_every=3", "optim.lr=0"]
    fresh = train(_cfg(target.spec, tmp_path / "fresh", *eagle3, *short), data=data, target=target)
    warm = train(_cfg(target.spec, tmp_path / "warm", *eagle3, *short, f"init_from={fc['final']}"),
                 data=data, target=target)  # fmt: skip
    mean_loss = lambda s: sum(h["loss"] for h in s["history"] if h["kind"] == "train") / 3  # noqa: E731
    assert mean_loss(warm) < 0.95 * mean_loss(fresh), (mean_loss(fresh), mean_loss(warm))  # same batches
    heads = load_heads(warm["final"], target)
    assert heads.config.layout == "reference"
    assert torch.equal(heads.d2t, load_heads(fc["final"], target).d2t)
    assert "warm start by headstart.heads.relayout" in (tmp_path / "warm" / "final" / "README.md").read_text()


def test_init_from_must_match_the_recipe_head(target, tmp_path):
    from headstart.errors import HeadstartError

    data = self_distilled(target, count=20)
    first = train(
        _cfg(target.spec, tmp_path / "a", *KINDS["medusa"], "trackers=[none]", "max_steps=2"),
        data=data,
        target=target,
    )
    wrong = _cfg(
        target.spec, tmp_path / "b", "head.kind=medusa", "head.num_heads=3", f"init_from={first['final']}"
    )
    with pytest.raises(HeadstartError, match="num_heads: recipe 3, heads 2"):
        train(wrong, data=data, target=target)
    with pytest.raises(HeadstartError, match="not a saved head"):
        train(_cfg(target.spec, tmp_path / "c", f"init_from={tmp_path}"), data=data, target=target)


def test_max_steps_0_resaves_medusa_heads_with_a_draft_vocabulary(target, tmp_path):
    """init_from + max_steps=0: no training step, a held-out evaluation, the same weights saved
    with a draft vocabulary of the training data's most frequent tokens."""
    from safetensors.torch import load_file

    from headstart.errors import HeadstartError

    data = self_distilled(target, count=20)
    first = train(
        _cfg(target.spec, tmp_path / "a", *KINDS["medusa"], "trackers=[none]", "max_steps=5"),
        data=data,
        target=target,
    )
    cfg = _cfg(target.spec, tmp_path / "b", *KINDS["medusa"], "trackers=[none]", "max_steps=0",
               "head.draft_vocab_size=50", f"init_from={first['final']}")  # fmt: skip
    summary = train(cfg, data=data, target=target)
    assert summary["steps"] == 0 and [h["kind"] for h in summary["history"]] == ["eval"]
    heads = load_heads(summary["final"], target)
    assert heads.has_draft_vocab and heads.draft_vocab_size == 50
    before = load_file(str(tmp_path / "a" / "final" / "model.safetensors"))
    after = load_file(str(tmp_path / "b" / "final" / "model.safetensors"))
    assert set(after) == set(before) | {"d2t", "t2d"}
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(HeadstartError, match="max_steps=0 trains nothing"):
        _cfg(target.spec, tmp_path / "c", "max_steps=0")


def test_optim_freeze_keeps_the_named_parameters_at_their_start(target, tmp_path):
    """optim.freeze=[lm_head]: the EAGLE-3 draft lm_head stays the target's draft-vocabulary rows
    while the rest of the head trains; a name that is no parameter is refused with the real ones."""
    from headstart.errors import HeadstartError

    data = self_distilled(target, count=20)
    cfg = _cfg(target.spec, tmp_path / "a", *KINDS["eagle3"], "trackers=[none]", "optim.freeze=[lm_head]")
    cfg.max_steps, cfg.eval_every, cfg.save_every = 10, 10, 10
    head = load_heads(train(cfg, data=data, target=target)["final"], target)
    rows = target.model.get_output_embeddings().weight[head.draft_ids()]
    assert torch.equal(head.lm_head.weight, rows.to(head.lm_head.weight.dtype))
    norm = target.model.get_decoder().norm.weight
    assert not torch.allclose(head.norm.weight, norm)  # the rest trained
    bad = _cfg(target.spec, tmp_path / "b", *KINDS["eagle3"], "trackers=[none]", "optim.freeze=[lm_heads]")
    with pytest.raises(HeadstartError, match="lm_heads.*midlayer"):
        train(bad, data=data, target=target)


def test_a_trained_draft_model_warm_starts_resumes_and_decodes_exactly(target, tmp_path):
    """The draft_model kind: its saved config (the draft's transformers config, JSON-shaped) matches
    a recipe's again, so init_from and --resume take it; it decodes as heads, identical to generate."""
    from headstart.inference.decoder import SpeculativeDecoder

    data = self_distilled(target, count=20)
    first = train(_cfg(target.spec, tmp_path / "a", *KINDS["draft_model"], "trackers=[none]", "max_steps=4"),
                  data=data, target=target)  # fmt: skip
    again = train(_cfg(target.spec, tmp_path / "b", *KINDS["draft_model"], "trackers=[none]", "max_steps=0",
                       f"init_from={first['final']}"), data=data, target=target)  # fmt: skip
    assert again["steps"] == 0
    more = _cfg(target.spec, tmp_path / "a", *KINDS["draft_model"], "trackers=[none]", "max_steps=6")
    assert train(more, data=data, target=target, resume=True)["steps"] == 6
    heads = load_heads(tmp_path / "a" / "final", target)
    ids = target.chat.user_prompt_ids("hello there")
    out = SpeculativeDecoder(target, heads, tree="chain:3").generate(
        [ids], max_new_tokens=12, eos_token_id=None
    )
    x = torch.tensor([ids])
    want = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
    assert out.token_ids[0] == want


def test_a_draft_model_trains_through_lora_and_saves_merged_weights(target, tmp_path):
    """head.lora_rank: only the adapters train (the base weights stay the target's copy), the saved
    head holds the merged weights under a plain draft's names (it loads without peft and has
    moved), a resume continues the adapters, and it decodes exactly."""
    from headstart.heads import HeadSpec, build_head
    from headstart.inference.decoder import SpeculativeDecoder

    data = self_distilled(target, count=20)
    args = [*KINDS["draft_model"], "head.lora_rank=4", "trackers=[none]", "optim.lr=5e-2"]
    summary = train(_cfg(target.spec, tmp_path / "a", *args, "max_steps=4"), data=data, target=target)
    assert summary["steps"] == 4
    start = build_head(HeadSpec(kind="draft_model", num_layers=1), target).state_dict()
    trained = load_heads(tmp_path / "a" / "final", target)
    mine = trained.state_dict()
    assert set(mine) == set(start)  # no adapter names: a plain draft's checkpoint
    moved = [k for k in start if "proj" in k and not torch.equal(mine[k], start[k])]
    assert moved  # the merged adapters changed the linear layers ...
    assert torch.equal(mine["model.lm_head.weight"], start["model.lm_head.weight"])  # ... and nothing else
    assert train(_cfg(target.spec, tmp_path / "a", *args, "max_steps=6"), data=data, target=target,
                 resume=True)["steps"] == 6  # fmt: skip
    ids = target.chat.user_prompt_ids("hello there")
    out = SpeculativeDecoder(target, load_heads(tmp_path / "a" / "final", target), tree="chain:3").generate(
        [ids], max_new_tokens=12, eos_token_id=None
    )
    x = torch.tensor([ids])
    want = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
    assert out.token_ids[0] == want
    with pytest.raises(HeadstartError, match="head.lora_rank is an option of draft_model"):
        HeadSpec(kind="eagle3", lora_rank=4)

"""A new head kind costs files, not switches: the toy kind (tests/kinds/toy_kind.py, one new file)
registered with ONE line builds, saves and loads through headstart's checkpoints, and decodes
exactly (greedy output equals the target's own `generate`) through the one engine."""

from __future__ import annotations

import pytest
import torch

from headstart import kinds


@pytest.fixture
def toy_registered():
    from headstart.kinds import HeadKind, register

    register(HeadKind("toy", {"fc": "toy_kind:ToyHead"}, "toy_kind:ToyDrafter", "toy_kind:toy_loss", "toy CE", head_section="toy_kind:ToyOptions", loss_section="toy_kind:ToyLoss", config_section="toy_kind:ToyConfig"))  # the one line  # fmt: skip
    yield
    kinds.KINDS.pop("toy")


def test_a_registered_kind_builds_saves_loads_and_decodes_exactly(toy_registered, tiny_llama, tmp_path):
    from toy_kind import ToyHead

    from headstart.heads import HeadSpec, build_head, load_heads_for_inference
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.plain import SamplingConfig
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    head = build_head(HeadSpec(kind="toy"), target)
    with torch.no_grad():
        head.block.weight.normal_(0, 0.5)  # drafts that are sometimes right, sometimes wrong
    head.save_pretrained(tmp_path / "toy")
    loaded = load_heads_for_inference(tmp_path / "toy", target)
    assert isinstance(loaded, ToyHead) and torch.equal(loaded.block.weight, head.block.weight)
    decoder = SpeculativeDecoder(target, loaded)
    prompts = [[1, 5, 9, 13], [1, 7, 3]]
    out = decoder.generate(prompts, sampling=SamplingConfig(max_new_tokens=12))
    for prompt, got in zip(prompts, out.token_ids, strict=True):
        x = torch.tensor([prompt])
        ref = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
        assert got == ref
    assert out.stats.target_forwards < len(prompts) * 12  # some drafts were accepted


def test_a_registered_kind_trains_through_the_one_loop(toy_registered, tiny_llama, tmp_path):
    """The trainer finds the kind's objective in the registry: a short run lowers its loss and
    leaves a head that loads as the toy kind, with held-out figures in its card."""
    from toy_kind import ToyHead

    from headstart.config import load_config
    from headstart.heads import load_heads
    from headstart.targets import load_target
    from headstart.train.config import TrainConfig
    from headstart.train.data import TrainData
    from headstart.train.loop import train

    target = load_target(str(tiny_llama))
    rows = [[1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 20, 21, 22, 23, 24, 25, 26, 27]] * 8
    data = TrainData(rows, [[0, 0, 1, 1, 1, 1, 1, 1, 1]] * 16, target.fingerprint, "toy data")
    cfg = load_config(TrainConfig, None, [f"target={tiny_llama}", f"output_dir={tmp_path / 'run'}", "head.kind=toy",
                                          "batch_size=4", "max_steps=30", "optim.lr=0.01", "eval_every=1000",
                                          "save_every=0", "data.holdout=4", "trackers=[]"])  # fmt: skip
    summary = train(cfg, data=data, target=target)
    losses = [h["loss"] for h in summary["history"] if h["kind"] == "train"]
    assert losses[-1] < losses[0], losses
    assert isinstance(load_heads(tmp_path / "run" / "final", target), ToyHead)
    assert "eval/top1/step0" in summary["final_eval"]


def test_a_registered_kind_brings_its_own_keys(toy_registered, tiny_llama, tmp_path):
    """The toy's own `head.*` and `loss.*` keys (its sections, named by its registration) are
    typed, reach its head and objective, and are refused for other kinds (and other kinds' keys
    for it) in one line: no shared class was edited to add them."""
    import toy_kind

    from headstart.config import load_config, to_dict
    from headstart.errors import HeadstartError
    from headstart.targets import load_target
    from headstart.train.config import TrainConfig
    from headstart.train.data import TrainData
    from headstart.train.loop import train

    base = [f"target={tiny_llama}", f"output_dir={tmp_path / 'run'}", "batch_size=4", "max_steps=2",
            "eval_every=1000", "save_every=0", "data.holdout=4", "trackers=[]"]  # fmt: skip
    cfg = load_config(
        TrainConfig, None, [*base, "head.kind=toy", "head.init_std=0.5", "loss.label_smoothing=0.1"]
    )
    assert (cfg.head.init_std, cfg.loss.label_smoothing) == (0.5, 0.1)
    assert to_dict(cfg)["head"]["init_std"] == 0.5 and to_dict(cfg)["loss"] == {"label_smoothing": 0.1}
    target = load_target(str(tiny_llama))
    rows = [[1, 5, 6, 7, 8, 9, 10, 11, 12]] * 16
    train(
        cfg,
        data=TrainData(rows, [[0, 0, 1, 1, 1, 1, 1, 1, 1]] * 16, target.fingerprint, "toy data"),
        target=target,
    )
    assert toy_kind.USED == {"init_std": 0.5, "label_smoothing": 0.1}
    for wrong, message in ((["head.kind=medusa", "head.init_std=0.5"], "head.init_std is an option of toy heads, not of medusa heads"),
                           (["head.kind=medusa", "loss.label_smoothing=0.1"], "loss.label_smoothing is an option of toy heads"),
                           (["head.kind=toy", "loss.ttt_steps=3"], "loss.ttt_steps is an option of eagle3 heads, not of toy heads"),
                           (["head.kind=toy", "head.init_sdt=0.5"], "unknown config key 'head.init_sdt'; did you mean 'init_std'"),
                           (["head.kind=toy", "head.init_std=big"], "'head.init_std' expects float")):  # fmt: skip
        with pytest.raises(HeadstartError, match=message):
            load_config(TrainConfig, None, [*base, *wrong])


def test_a_registered_kind_brings_its_own_checkpoint_fields(toy_registered, tiny_llama, tmp_path):
    """The toy's own field of config.json (its config section, ToyConfig) is written beside the
    shared ones, without any other kind's; it loads back into the head; a warm start that changes
    it is refused (it is marked SHAPE); another kind's file holding it away from its default is
    refused naming the toy. No shared class was edited to add it."""
    import json

    from headstart.config import load_config
    from headstart.errors import HeadstartError
    from headstart.heads import load_heads
    from headstart.heads.config import HeadConfig
    from headstart.targets import load_target
    from headstart.train.config import TrainConfig
    from headstart.train.data import TrainData
    from headstart.train.loop import train

    target = load_target(str(tiny_llama))
    data = TrainData([[1, 5, 6, 7, 8, 9, 10, 11, 12]] * 16, [[0, 0, 1, 1, 1, 1, 1, 1, 1]] * 16,
                     target.fingerprint, "toy data")  # fmt: skip
    base = ["batch_size=4", "max_steps=2", "eval_every=1000", "save_every=0", "data.holdout=4", "trackers=[]",
            f"target={tiny_llama}", "head.kind=toy"]  # fmt: skip
    cfg = load_config(TrainConfig, None, [*base, f"output_dir={tmp_path / 'run'}", "head.bias=false"])
    train(cfg, data=data, target=target)
    saved = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert saved["bias"] is False
    assert not {"num_heads", "block_size", "mask_token_id", "fc_norm", "draft_from"} & set(saved)
    head = load_heads(tmp_path / "run" / "final", target)
    assert head.config.bias is False and head.block.bias is None
    warm = load_config(TrainConfig, None, [*base, f"output_dir={tmp_path / 'warm'}", "head.bias=true",
                                           f"init_from={tmp_path / 'run' / 'final'}"])  # fmt: skip
    with pytest.raises(HeadstartError, match="bias: recipe True, heads False"):
        train(warm, data=data, target=target)
    medusa = tmp_path / "medusa"
    medusa.mkdir()
    fields = json.loads(HeadConfig(kind="medusa", **{k: saved[k] for k in ("hidden_size", "vocab_size", "target",
                                                                        "target_config")}).to_json())  # fmt: skip
    (medusa / "config.json").write_text(json.dumps(fields | {"bias": False}))
    with pytest.raises(HeadstartError, match="bias=False is a field of toy heads, not of this medusa head"):
        HeadConfig.read(medusa)
    (medusa / "config.json").write_text(json.dumps(fields | {"bias": True}))  # at its default: dropped
    assert HeadConfig.read(medusa).kind == "medusa"


def test_an_unregistered_kind_is_one_line(tiny_llama):
    from headstart.errors import HeadstartError
    from headstart.heads import HeadSpec

    with pytest.raises(
        HeadstartError, match="unknown head kind 'toy' .fix: use one of medusa, eagle, eagle3, dflash"
    ):
        HeadSpec(kind="toy")

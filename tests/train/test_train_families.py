"""Heads train on every decoder family (sliding-window, mixed, MoE, soft-capped, sinks, no-RoPE):
a short run on a tiny random config of each lowers the loss of Medusa, EAGLE-3 and DFlash heads."""

from __future__ import annotations

import pytest
from test_train_loop import _cfg
from tiny import FAMILIES, FC_LAYOUT, make_target_dir
from tiny_data import self_distilled

from headstart.targets import load_target
from headstart.train.loop import train


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("kind", ["medusa", "eagle3", "dflash"])
def test_family_training_lowers_the_loss(tiny_root, tmp_path, family, kind):
    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    head = {
        "medusa": ["head.kind=medusa", "head.num_heads=2"],
        "eagle3": ["head.kind=eagle3", "head.draft_vocab_size=96", "loss.ttt_steps=2",
                   f"head.layout={'fc' if family in FC_LAYOUT else 'reference'}"],
        "dflash": ["head.kind=dflash", "head.draft_vocab_size=96", "head.block_size=4", "loss.dflash_anchors=8"],
    }[kind]  # fmt: skip
    cfg = _cfg(target.spec, tmp_path, *head, "max_steps=20", "eval_every=20", "save_every=20", "trackers=[]")
    summary = train(cfg, data=self_distilled(target, count=12), target=target)
    losses = [h["loss"] for h in summary["history"] if h["kind"] == "train"]
    assert losses[-1] < (0.85 if kind == "medusa" else 0.92) * losses[0], (family, losses)

"""optim.name=muon: Muon on the hidden matrices, AdamW on the rest, one optimizer to the loop:
the scheduler sets both halves' rates, a checkpoint holds both states (a resumed run ends where
one run ends), and a run with it trains."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headstart.config import load_config
from headstart.train.config import TrainConfig
from headstart.train.optimizers import MuonAdamW, muon_split
from headstart.train.setup import make_optimizer


def named_head():
    torch.manual_seed(0)
    return {
        "fc.weight": torch.nn.Parameter(torch.randn(8, 24)),
        "midlayer.layer.mlp.up_proj.weight": torch.nn.Parameter(torch.randn(16, 8)),
        "midlayer.layer.input_layernorm.weight": torch.nn.Parameter(torch.ones(8)),
        "lm_head.weight": torch.nn.Parameter(torch.randn(50, 8)),
        "embed_tokens.weight": torch.nn.Parameter(torch.randn(50, 8)),
    }


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    params = named_head()
    muon, adamw = muon_split(params.items())
    assert [id(p) for p in muon] == [id(params["fc.weight"]), id(params["midlayer.layer.mlp.up_proj.weight"])]
    assert {id(p) for p in adamw} == {id(params[n]) for n in ("midlayer.layer.input_layernorm.weight",
                                                               "lm_head.weight", "embed_tokens.weight")}  # fmt: skip


def test_the_schedule_sets_both_halves_rates_and_both_step():
    params = named_head()
    cfg = load_config(TrainConfig, None, ["optim.name=muon", "optim.lr=0.01", "optim.muon_lr=0.02", "max_steps=10",
                                          "optim.warmup_steps=0", "optim.schedule=linear", "trackers=[none]"])  # fmt: skip
    optimizer, scheduler = make_optimizer(cfg, list(params.items()))
    assert isinstance(optimizer, MuonAdamW)
    before = {n: p.detach().clone() for n, p in params.items()}
    for p in params.values():
        p.grad = torch.randn_like(p)
    optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in params.items())  # every parameter moved
    for _ in range(5):
        scheduler.step()
    assert [g["lr"] for g in optimizer.muon.param_groups] == pytest.approx([0.01])  # 0.02 halfway down
    assert [g["lr"] for g in optimizer.adamw.param_groups] == pytest.approx([0.005])
    # the update of a Muon matrix is orthogonalised: its singular values all about equal
    fc = params["fc.weight"]
    fc.grad, previous = torch.randn_like(fc), fc.detach().clone()
    optimizer.muon.state.clear()  # no momentum: this step's update alone
    optimizer.step()
    singular = torch.linalg.svdvals(fc.detach() - previous)
    assert float(singular.max() / singular.min()) < 1.6  # Newton-Schulz's band, not the gradient's spread


def test_a_muon_state_dict_restores_both_halves():
    params = named_head()
    cfg = load_config(TrainConfig, None, ["optim.name=muon", "trackers=[none]"])
    optimizer, _ = make_optimizer(cfg, list(params.items()))
    for p in params.values():
        p.grad = torch.randn_like(p)
    optimizer.step()
    saved = optimizer.state_dict()
    again, _ = make_optimizer(cfg, list(params.items()))
    again.load_state_dict(saved)
    fc, lm = params["fc.weight"], params["lm_head.weight"]
    assert torch.equal(again.muon.state[fc]["momentum_buffer"], optimizer.muon.state[fc]["momentum_buffer"])
    assert torch.equal(again.adamw.state[lm]["exp_avg_sq"], optimizer.adamw.state[lm]["exp_avg_sq"])


@pytest.mark.timeout(300)
def test_a_resumed_muon_run_ends_where_one_run_ends(tiny_llama, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_data import self_distilled

    from headstart.targets import load_target
    from headstart.train.loop import train

    target = load_target(str(tiny_llama))
    data = self_distilled(target)
    base = [f"target={tiny_llama}", "trackers=[none]", "head.kind=eagle3", "loss.ttt_steps=2", "batch_size=4",
            "log_every=1", "eval_every=100", "save_every=3", "optim.name=muon", "optim.lr=3e-3",
            "optim.schedule=constant", "optim.warmup_steps=2"]  # fmt: skip

    def run(out, steps, resume=False):
        cfg = load_config(TrainConfig, None, [*base, f"output_dir={tmp_path / out}", f"max_steps={steps}"])
        return train(cfg, data=data, target=target, resume=resume)

    whole = run("whole", 6)
    run("cut", 3)
    resumed = run("cut", 6, resume=True)
    assert [h["loss"] for h in resumed["history"] if h["kind"] == "train"] == [
        h["loss"] for h in whole["history"] if h["kind"] == "train"
    ]
    a = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    longer = [h["loss"] for h in run("longer", 20)["history"] if h["kind"] == "train"]
    assert sum(longer[-5:]) < sum(longer[:5])  # and it trains

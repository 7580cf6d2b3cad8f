"""Warmup-stable-decay: the peak rate held, a linear decay to 0 at the end, placed by max_steps or
by the time budget (whose choice a resumed run keeps), and a whole run under a budget ending
with the decay done."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from headstart.config import load_config
from headstart.train import loop
from headstart.train.config import TrainConfig
from headstart.train.schedule import WarmupStableDecay
from headstart.train.setup import make_optimizer


def rates(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


def test_wsd_warms_up_holds_the_peak_then_decays_its_share_to_zero():
    cfg = load_config(TrainConfig, None, ["max_steps=20", "optim.lr=0.01", "optim.warmup_steps=4",
                                          "optim.schedule=wsd", "optim.decay=0.25", "trackers=[none]"])  # fmt: skip
    optimizer, scheduler = make_optimizer(cfg, [torch.nn.Parameter(torch.zeros(2))])
    got = rates(scheduler, optimizer, 20)
    assert got[0] == 0.0 and got[2] == pytest.approx(0.005)  # transformers' warm-up
    assert got[4:16] == pytest.approx([0.01] * 12)  # the plateau: 15 of 20 steps
    assert got[16:] == pytest.approx([0.008, 0.006, 0.004, 0.002])  # the last 5 decay linearly
    assert scheduler.get_last_lr()[0] == 0.0 and scheduler.end_step == 20


def test_a_timed_decay_starts_where_it_is_told_and_a_resumed_run_keeps_it():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = WarmupStableDecay(optimizer, 0, 1000, 0.2)
    rates(scheduler, optimizer, 10)
    scheduler.start_decay(10, 4)
    assert scheduler.end_step == 14 and optimizer.param_groups[0]["lr"] == 1.0
    assert rates(scheduler, optimizer, 2) == [1.0, 0.75]
    saved = scheduler.state_dict()
    # a resume with another max_steps: the budget's decay stands, the rate is the saved one
    again = torch.optim.AdamW([param], lr=1.0)
    resumed = WarmupStableDecay(again, 0, 5000, 0.2)
    resumed.load_state_dict(saved)
    assert resumed.end_step == 14 and again.param_groups[0]["lr"] == pytest.approx(0.5)
    assert rates(resumed, again, 2) == pytest.approx([0.5, 0.25]) and resumed.get_last_lr() == [0.0]


def test_a_decay_placed_by_max_steps_follows_a_resumed_runs_max_steps():
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = WarmupStableDecay(optimizer, 0, 10, 0.2)
    rates(scheduler, optimizer, 6)  # on the plateau
    again = torch.optim.AdamW([param], lr=1.0)
    longer = WarmupStableDecay(again, 0, 100, 0.2)  # `--resume max_steps=100`: the plateau goes on
    longer.load_state_dict(scheduler.state_dict())
    assert longer.end_step == 100 and longer.last_epoch == 6
    assert rates(longer, again, 74) == [1.0] * 74 and longer.get_last_lr() == [1.0]
    assert rates(longer, again, 20)[-1] == pytest.approx(0.05)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Ticking(Clock):
    """A clock that moves 10 ms at every reading: a run's steps take time, the same on any machine."""

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


def test_the_budget_places_the_decay_in_its_last_share_sized_by_the_mean_pace(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(loop, "clock", clock)
    budget = loop.Budget(110.0, started=clock())
    clock.now += 10.0  # start-up
    budget.ready()  # 100 s of training time
    for took in (5.0, 1.0, 1.0, 1.0):  # the first step warms up and is not the pace
        clock.now += took
        budget.stepped()
    assert budget.decay_steps(0.2) == 0  # 92 s left: not yet
    clock.now = 1000.0 + 10.0 + 80.5  # 19.5 s left, less a step and 1 s of slack: in the last 20%
    assert budget.decay_steps(0.2) == int((19.5 - 1.1 - 1.0) / 1.1)
    assert loop.Budget(0.0, started=clock()).decay_steps(0.2) == 0  # no budget: max_steps decides


@pytest.mark.timeout(300)
def test_a_budgeted_wsd_run_ends_with_its_decay_done(tiny_llama, tmp_path, monkeypatch):
    """Under time_budget_s the run ends when the decay the budget placed ends, its last step at
    a rate of ~0, long before max_steps, with the final head written (not a budget stop)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_data import self_distilled

    from headstart.targets import load_target
    from headstart.train.loop import train

    target = load_target(str(tiny_llama))
    data = self_distilled(target)
    cfg = load_config(TrainConfig, None, [
        f"target={tiny_llama}", "trackers=[none]", "head.kind=eagle3", "loss.ttt_steps=2", "batch_size=4",
        "max_steps=100000", "log_every=1", "eval_every=100000", "save_every=0", "optim.lr=3e-3",
        "optim.schedule=wsd", "optim.decay=0.3", "optim.warmup_steps=2", "time_budget_s=8",
        f"output_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    clock = Ticking()  # the run's clock in steps of its own: the outcome cannot depend on the machine's load
    monkeypatch.setattr(loop, "clock", clock)
    summary = train(cfg, data=data, target=target)
    assert clock.now - 1000.0 < 8.0  # ended within its budget, by the run's own clock
    assert "stopped" not in summary, summary["stopped"]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    lrs = [h["lr"] for h in summary["history"] if h["kind"] == "train"]
    assert 10 < summary["steps"] < 100000 and len(lrs) == summary["steps"]
    assert max(lrs) == pytest.approx(3e-3)  # the plateau
    assert lrs[-1] < 3e-3 * 0.2  # the decay's last step: near 0
    assert all(b <= a for a, b in zip(lrs[-5:], lrs[-4:], strict=False))  # falling to the end

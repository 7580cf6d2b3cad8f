"""A run killed with SIGKILL mid-training resumes from its last checkpoint and ends exactly where
an uninterrupted run ends (same weights, same logged losses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RUNNER = Path(__file__).with_name("run_tiny.py")
# EAGLE-1: its input noise checks that the RNG state is restored too; grad_accum checks the data position.
ARGS = [
    "head.kind=eagle",
    "loss.eval_steps=2",
    "max_steps=12",
    "save_every=3",
    "keep_last=2",
    "eval_every=6",
    "log_every=1",
    "batch_size=4",
    "grad_accum=2",
    "optim.lr=3e-3",
]


def _run(target, out, *extra, wait=True):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(RUNNER), str(target), str(out), *ARGS, *extra]
    if wait:
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
        return None
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow  # ~30 s of CPU in 3 subprocesses (100 s wall on the shared 2-core box)
@pytest.mark.timeout(600)
def test_sigkill_then_resume_matches_uninterrupted(tiny_llama, tmp_path):
    _run(tiny_llama, tmp_path / "ref")
    victim = _run(tiny_llama, tmp_path / "cut", wait=False)
    ckpts = tmp_path / "cut" / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "step-00000006" / "trainer_state.json").is_file():
        assert victim.poll() is None, "run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp_path / "cut" / "final").exists()
    kept = sorted(p.name for p in ckpts.iterdir() if not p.name.startswith("."))
    assert len(kept) <= 2 and kept[-1] >= "step-00000006"  # keep_last honoured
    _run(tiny_llama, tmp_path / "cut", "--resume")
    ref = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    cut = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert ref.keys() == cut.keys()
    for key in ref:
        torch.testing.assert_close(cut[key], ref[key], rtol=0, atol=0, msg=key)
    ref_res = json.loads((tmp_path / "ref" / "results.json").read_text())
    cut_res = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert cut_res["resumed_from"] >= 6 and ref_res["resumed_from"] == 0
    assert [h["loss"] for h in cut_res["history"] if h["kind"] == "train"] == [
        h["loss"] for h in ref_res["history"] if h["kind"] == "train"
    ]
    assert cut_res["final_eval"] == ref_res["final_eval"]


@pytest.mark.timeout(600)
class Ticking:
    """A clock that moves 10 ms at every reading: a run's steps take time, the same on any machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


def test_time_budgeted_runs_end_where_one_run_ends(tiny_llama, tmp_path, monkeypatch):
    """`--time-budget`: each run stops cleanly before its budget with a checkpoint, and resumed
    budgeted runs give the weights and losses of one uninterrupted run (the GPU's ~10-minute loans)."""
    sys.path.insert(0, str(RUNNER.parent))
    from tiny_data import self_distilled

    from headstart.config import load_config
    from headstart.targets import load_target
    from headstart.train import loop
    from headstart.train.config import TrainConfig
    from headstart.train.loop import train

    target = load_target(str(tiny_llama))
    data = self_distilled(target)
    base = [f"target={tiny_llama}", "trackers=[none]", *ARGS, "save_every=0", "max_steps=40"]
    torch.set_num_threads(1)
    clock = Ticking()  # the run's clock in steps of its own (headstart.train.loop.clock): no load decides
    monkeypatch.setattr(loop, "clock", clock)
    ref = train(
        load_config(TrainConfig, None, [*base, f"output_dir={tmp_path / 'ref'}"]), data=data, target=target
    )
    budget = round(0.3 * (clock.now - 1000.0), 2)  # about a third of the run
    pieces = []
    for run in range(200):
        cfg = load_config(
            TrainConfig, None, [*base, f"output_dir={tmp_path / 'cut'}", f"time_budget_s={budget}"]
        )
        clock.now = started = 1000.0
        summary = train(cfg, data=data, target=target, resume=run > 0)
        assert clock.now - started <= budget  # stopped before its budget
        pieces.append(summary["steps"])
        if "stopped" not in summary:
            break
        assert Path(summary["checkpoint"]).name == f"step-{summary['steps']:08d}"
    assert len(pieces) >= 2 and pieces[-1] == 40, pieces  # it took several budgeted runs
    a = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    assert [h["loss"] for h in summary["history"] if h["kind"] == "train"] == [
        h["loss"] for h in ref["history"] if h["kind"] == "train"
    ]

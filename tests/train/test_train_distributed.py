"""`accelerate launch --multi_gpu --num_processes 2` on CPU (gloo) gives the same losses, weights
and held-out metrics as one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RUNNER = Path(__file__).with_name("run_tiny.py")
# Medusa has no input noise. Conversations differ in length (--vary): the processes normalise by the
# global token count, so their averaged gradients equal the one-process gradient.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]
"""accelerate's launcher from this interpreter: the venv's bin/ need not be on PATH (make test)."""
ARGS = [
    "--vary",
    "head.kind=medusa",
    "max_steps=6",
    "log_every=1",
    "eval_every=3",
    "save_every=0",
    "data.holdout=5",
    "optim.lr=3e-3",
]


@pytest.mark.slow  # two process launches + gloo set-up: ~35 s wall on the shared 2-core box
@pytest.mark.timeout(600)
def test_two_cpu_processes_match_one(tiny_llama, tmp_path):
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")
    launch = [
        *LAUNCH,
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "29533",
    ]
    subprocess.run(
        [*launch, str(RUNNER), str(tiny_llama), str(tmp_path / "two"), *ARGS, "batch_size=2"],
        check=True,
        env=env,
        capture_output=True,
        timeout=400,
    )
    subprocess.run(
        [sys.executable, str(RUNNER), str(tiny_llama), str(tmp_path / "one"), *ARGS, "batch_size=4"],
        check=True,
        env=env,
        capture_output=True,
        timeout=400,
    )
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert two["processes"] == 2 and one["processes"] == 1
    loss_two = [h["loss"] for h in two["history"] if h["kind"] == "train"]
    loss_one = [h["loss"] for h in one["history"] if h["kind"] == "train"]
    assert len(loss_one) == 6
    torch.testing.assert_close(torch.tensor(loss_two), torch.tensor(loss_one), rtol=1e-5, atol=1e-5)
    evals_two = [h for h in two["history"] if h["kind"] == "eval"]
    evals_one = [h for h in one["history"] if h["kind"] == "eval"]
    assert [h["eval/predictions"] for h in evals_two] == [h["eval/predictions"] for h in evals_one]
    for a, b in zip(evals_two, evals_one, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("eval/top"):
                assert abs(a[key] - b[key]) < 1e-9, key
    w2 = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    w1 = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-4, atol=1e-5, msg=key)


# one two-process launch: ~8 s on the 2-core box, so in the default run
@pytest.mark.timeout(600)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without GPUs")
def test_gpu_launch_config_without_gpus_forms_one_cpu_group(tiny_llama, tmp_path):
    """The README's ddp.yaml (MULTI_GPU) launched on a machine without GPUs and without
    ACCELERATE_USE_CPU: before, two independent one-process runs wrote the same output_dir; now
    the processes form one CPU group."""
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    config = Path(__file__).parents[2] / "recipes" / "accelerate" / "cpu_2proc.yaml"
    launch = [
        *LAUNCH,
        "--config_file",
        str(config),
        "--main_process_port",
        "29534",
    ]
    proc = subprocess.run(
        [*launch, str(RUNNER), str(tiny_llama), str(tmp_path / "two"), *ARGS, "batch_size=2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "two" / "results.json").read_text())["processes"] == 2

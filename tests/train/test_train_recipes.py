"""Every shipped recipe parses, names its command on line 1, and dry-runs with its accelerate
config (GPU recipes are validated here, not run: this machine has no GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.train.config import TrainConfig
from headstart.train.dryrun import accelerate_plan, dry_run

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("train_*.yaml"))
ACCELERATE = sorted((Path(__file__).resolve().parents[2] / "recipes" / "accelerate").glob("*.yaml"))


def test_recipes_exist():
    names = {p.name for p in RECIPES}
    assert {
        "train_smollm2_medusa.yaml",
        "train_smollm2_eagle3.yaml",
        "train_llama31_8b_eagle3.yaml",
        "train_vicuna7b_medusa2.yaml",
    } <= names
    assert {"ddp.yaml", "fsdp.yaml", "zero2.yaml", "zero3.yaml", "cpu_2proc.yaml"} <= {
        p.name for p in ACCELERATE
    }


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_and_dry_runs_with_its_launch_config(recipe):
    first = recipe.read_text().splitlines()[0]
    assert first.startswith("# ") and f"headstart train --recipe recipes/{recipe.name}" in first
    cfg = load_config(TrainConfig, recipe)
    launch = re.search(r"--config_file (\S+)", first)
    config = str(recipe.parents[1] / launch.group(1)) if launch else None
    plan = dry_run(cfg, config)
    assert plan["global_batch"] == cfg.batch_size * cfg.grad_accum * plan["accelerate"]["num_processes"]
    if launch:  # the GPU recipes
        assert plan["accelerate"]["distributed_type"] in ("FSDP", "DEEPSPEED", "MULTI_GPU")
        assert cfg.mixed_precision == plan["accelerate"]["mixed_precision"] == "bf16"
    else:
        # CPU recipes: the embedded target, or a GGUF file that the header says how to get
        assert cfg.target == "smollm2" or (
            cfg.target.endswith(".gguf") and "pip install" in recipe.read_text()
        )
        assert plan["cannot_run_here"] == []


@pytest.mark.parametrize("config", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_parse(config):
    plan = accelerate_plan(config)
    assert plan["num_processes"] >= 2
    if "zero" in config.name:
        assert plan["zero_stage"] == int(config.name[4])


def test_deepspeed_accumulation_must_match_the_recipe():
    zero2 = next(p for p in ACCELERATE if p.name == "zero2.yaml")
    cfg = load_config(TrainConfig, None, ["grad_accum=2", "trackers=[none]"])
    with pytest.raises(HeadstartError, match="gradient_accumulation_steps=4"):
        dry_run(cfg, str(zero2))


def test_cli_dry_run_prints_the_plan(capsys):
    import json

    from headstart.cli import main

    recipe = next(p for p in RECIPES if p.name == "train_vicuna7b_medusa2.yaml")
    zero2 = next(p for p in ACCELERATE if p.name == "zero2.yaml")
    assert (
        main(
            ["train", "--recipe", str(recipe), "--dry-run", "--accelerate-config", str(zero2), "max_steps=5"]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["loss"] == "Medusa-2 (joint LoRA)" and plan["max_steps"] == 5 and plan["global_batch"] == 64

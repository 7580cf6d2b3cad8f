"""Every training recipe (recipes/ and experiments/) parses, names its command on line 1, and
dry-runs with its accelerate config (GPU recipes are validated here, not run: this machine has no GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headstart.config import load_config
from headstart.errors import HeadstartError
from headstart.train.config import TrainConfig
from headstart.train.dryrun import accelerate_plan, dry_run

REPO = Path(__file__).resolve().parents[2]


def _train_recipes() -> list[Path]:
    found = [*(REPO / "recipes").glob("*.yaml"), *(REPO / "experiments").rglob("*.yaml")]
    return sorted(p for p in found if " headstart train --recipe " in p.read_text().splitlines()[0])


RECIPES = _train_recipes()
ACCELERATE = sorted((REPO / "recipes" / "accelerate").glob("*.yaml"))


def test_recipes_exist():
    names = {p.name for p in RECIPES if p.parent.name == "recipes"}
    assert {
        "smollm2-eagle3-cpu.yaml",
        "smollm2-eagle3-gpu.yaml",
        "smollm2-medusa-cpu.yaml",
        "smollm2-dflash-gpu.yaml",
        "llama31-8b-eagle3-gpu.yaml",
        "vicuna7b-medusa2-lora-gpu.yaml",
    } <= names
    assert any(p.parts[-3] == "experiments" for p in RECIPES)  # the shipped heads' lineage
    assert {"ddp.yaml", "fsdp.yaml", "zero2.yaml", "zero3.yaml", "cpu_2proc.yaml"} <= {
        p.name for p in ACCELERATE
    }


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_recipe_parses_and_dry_runs_with_its_launch_config(recipe):
    first = recipe.read_text().splitlines()[0]
    assert (
        first.startswith("# ") and f"headstart train --recipe {recipe.relative_to(REPO).as_posix()}" in first
    )
    cfg = load_config(TrainConfig, recipe)
    launch = re.search(r"--config_file (\S+)", first)
    config = str(REPO / launch.group(1)) if launch else None
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
        # data a run writes under runs/ first (distill, or an earlier stage) may be missing here;
        # anything else (data/smollm2-kept included) must be
        assert [m for m in plan["cannot_run_here"] if not m.startswith("distilled data runs/")] == []


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


def test_cli_dry_run_prints_the_plan(capsys, tmp_path):
    """The plan on stdout; rc 0 once its data exists (the recipe's runs/ data is not here: then the
    dry run fails as the real run would, naming it, after printing the plan)."""
    import json

    from headstart.cli import main

    recipe = next(p for p in RECIPES if p.name == "vicuna7b-medusa2-lora-gpu.yaml")
    zero2 = next(p for p in ACCELERATE if p.name == "zero2.yaml")
    args = ["train", "--recipe", str(recipe), "--dry-run", "--accelerate-config", str(zero2), "max_steps=5",
            f"output_dir={tmp_path / 'out'}"]  # fmt: skip
    assert main(args) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["missing_data"] and "distilled data runs/" in captured.err
    assert main([*args, f"data.path=[{tmp_path}]", "data.eval_path=[]"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["loss"] == "Medusa-2 (joint LoRA)" and plan["max_steps"] == 5 and plan["global_batch"] == 64

"""`headstart train --dry-run`: validate a recipe and its accelerate config and describe the run,
without loading the target's weights or the data (so GPU recipes for 7-8B targets can be checked
anywhere). What the real run would refuse (data, output_dir, init_from, the head's shape against
the target's config when that config is at hand) fails the dry run too, in the real run's words;
what only this machine lacks (GPUs, deepspeed) is a warning: the recipe may be fine elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headstart.config import to_dict
from headstart.errors import HeadstartError
from headstart.train.config import TrainConfig
from headstart.train.setup import trackers


def accelerate_plan(path: str | Path) -> dict[str, Any]:
    """Parse an accelerate config with accelerate's own reader; the fields that shape the run."""
    from accelerate.commands.config.config_args import load_config_from_file

    if not Path(path).is_file():
        raise HeadstartError(f"accelerate config not found: {path}", "pass a file from recipes/accelerate/")
    import yaml

    try:
        config = load_config_from_file(str(path))
    except (
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        yaml.YAMLError,
    ) as err:  # not YAML, not UTF-8 too
        reason = " ".join(str(err).split())[:200]
        raise HeadstartError(
            f"accelerate cannot read {path}: {reason}", "fix the accelerate config (see `accelerate config`)"
        ) from None
    plan = {
        "distributed_type": str(config.distributed_type).split(".")[-1],
        "num_processes": int(config.num_processes or 1),
        "num_machines": int(config.num_machines or 1),
        "mixed_precision": str(config.mixed_precision).split(".")[-1],
        "use_cpu": bool(config.use_cpu),
    }
    if plan["distributed_type"] == "DEEPSPEED":
        ds = config.deepspeed_config or {}
        if int(ds.get("zero_stage", -1)) not in (0, 1, 2, 3):
            raise HeadstartError(f"{path}: deepspeed_config.zero_stage must be 0-3", "set zero_stage: 2 or 3")
        plan["zero_stage"] = int(ds["zero_stage"])
        plan["deepspeed_grad_accum"] = ds.get("gradient_accumulation_steps")
    if plan["distributed_type"] == "FSDP":
        fsdp = config.fsdp_config or {}
        plan["fsdp"] = {k: fsdp[k] for k in sorted(fsdp) if k.startswith("fsdp_")}
    return plan


def dry_run(cfg: TrainConfig, accelerate_config: str | None = None, resume: bool = False) -> dict[str, Any]:
    """The run a recipe describes: head, data, batch arithmetic, trackers, distributed layout."""
    chosen = trackers(cfg)
    procs = (
        accelerate_plan(accelerate_config)
        if accelerate_config
        else {"num_processes": 1, "distributed_type": "NO"}
    )
    world = procs["num_processes"] * procs.get("num_machines", 1)
    if cfg.mixed_precision != "no" and procs.get("mixed_precision") not in (None, "no", cfg.mixed_precision):
        raise HeadstartError(
            f"recipe mixed_precision={cfg.mixed_precision} but the accelerate config says {procs['mixed_precision']}",
            "make them agree",
        )
    ds_accum = procs.pop("deepspeed_grad_accum", None)
    if ds_accum not in (None, "auto") and int(ds_accum) != cfg.grad_accum:
        raise HeadstartError(
            f"accelerate config sets gradient_accumulation_steps={ds_accum} but the recipe has grad_accum={cfg.grad_accum}",
            f"set grad_accum={ds_accum} or change the DeepSpeed config",
        )
    from headstart import kinds

    kind = kinds.get(cfg.head.kind)
    loss = kind.joint_lora if cfg.lora.enabled else kind.loss.format(cfg=cfg)
    return {
        "target": cfg.target,
        "head": to_dict(cfg.head),
        "loss": loss,
        "data": {
            "path": cfg.data.path,
            "eval_path": cfg.data.eval_path,
            "holdout": cfg.data.holdout,
            "mode": cfg.data.mode,
            "max_length": cfg.data.max_length,
            "pack": cfg.data.pack,
        },  # fmt: skip
        "init_from": cfg.init_from,
        "global_batch": cfg.batch_size * cfg.grad_accum * world,
        "max_steps": cfg.max_steps,
        # packed: batch_size counts rows of data.pack positions, each of several conversations
        ("rows_seen" if cfg.data.pack else "conversations_seen"): cfg.batch_size
        * cfg.grad_accum
        * world
        * cfg.max_steps,
        "trackers": chosen,
        "accelerate": procs,
        "output_dir": cfg.output_dir,
        "cannot_run_here": cannot_run_here(procs, cfg.cpu),
        "missing_data": missing_data(cfg),
        "output_problems": output_problems(cfg, resume),
        "head_problems": head_problems(cfg),
    }


def refusals(plan: dict[str, Any]) -> HeadstartError | None:
    """What in `plan` the real run would refuse, as the one error the dry run fails with."""
    refused = plan["missing_data"] + plan["output_problems"] + plan["head_problems"]
    if not refused:
        return None
    parts = [line.removesuffix(")").rsplit(" (fix: ", 1) for line in refused]
    return HeadstartError(
        "the real run would refuse this recipe: " + "; ".join(part[0] for part in parts),
        "; ".join(part[1] for part in parts if len(part) == 2) or "see the plan above",
    )


def missing_data(cfg: TrainConfig) -> list[str]:
    """The recipe's data directories that are not there (the real run would stop at its first read),
    in the real run's words, as every refusal of the plan: "WHAT (fix: FIX)"."""
    missing = (
        []
        if cfg.data.path
        else ["no training data: data.path is empty (fix: set data.path=DIR, a `headstart distill` output)"]
    )
    return missing + [
        f"distilled data {path} does not exist (fix: check the path, or run `headstart distill --out DIR`)"
        for path in [*cfg.data.path, *cfg.data.eval_path]
        if not Path(path).expanduser().is_dir()
    ]


def output_problems(cfg: TrainConfig, resume: bool = False) -> list[str]:
    """What the real run would refuse about output_dir before loading anything (a protected,
    foreign or unwritable directory, a file, a finished run without --resume, or a --resume that
    changes what the run computes), each in the real run's words."""
    from headstart.outputs import check_output_dir
    from headstart.train import checkpoints
    from headstart.train.loop import check_run_dir

    try:
        check_output_dir(cfg.output_dir, "output_dir")
        check_run_dir(Path(cfg.output_dir).expanduser(), resume)
        if resume:
            checkpoints.check_same_run(to_dict(cfg), Path(cfg.output_dir).expanduser() / "checkpoints")
    except HeadstartError as err:
        return [f"{err.what} (fix: {err.fix})" if err.fix else err.what]
    return []


def head_problems(cfg: TrainConfig) -> list[str]:
    """What the real run would refuse about the head once it reads the target: the head's shape
    against the target's config (layers, vocabulary, a draft model's depth or sibling), read
    without the weights; and an init_from that is not a saved head. Where the target's config is
    not at hand (a Hub id with no network and no cache) the shape is not checked, and said."""
    import logging

    from headstart.heads.build import head_config
    from headstart.targets import load_target

    if cfg.init_from and not (Path(cfg.init_from).expanduser() / "config.json").is_file():
        return [f"init_from={cfg.init_from} is not a saved head (no config.json) (fix: point init_from at a "
                "directory written by headstart train (output_dir/final))"]  # fmt: skip
    try:
        target = load_target(cfg.target, weights=False)
    except HeadstartError as err:
        logging.getLogger(__name__).warning(f"note: the head's shape is not checked here: {err.what}")
        return []
    try:
        head_config(cfg.head, target)
    except HeadstartError as err:
        return [f"{err.what} (fix: {err.fix})" if err.fix else err.what]
    return []


def cannot_run_here(procs: dict[str, Any], cpu: bool = False) -> list[str]:
    """What this machine lacks for the planned launch (empty: it can run here)."""
    import importlib.util

    import torch

    missing = []
    if not cpu and not procs.get("use_cpu", True) and procs.get("distributed_type") != "NO":
        gpus = torch.cuda.device_count()
        if gpus < procs["num_processes"]:
            missing.append(f"{procs['num_processes']} GPUs (found {gpus})")
    if procs.get("distributed_type") == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        missing.append("deepspeed (pip install deepspeed)")
    return missing

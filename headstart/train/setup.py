"""Everything before the first training step: accelerator, target, data checks, head, optimizer.

All user-fixable problems (misspelt recipe keys are caught earlier by load_config; data from
another target, empty data, a head that does not fit the target, a missing tracker) raise here,
before any forward pass.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headstart.config import to_dict
from headstart.errors import HeadstartError
from headstart.heads import build_head, head_config
from headstart.train.config import TrainConfig
from headstart.train.data import TrainData, check_data, load_distilled_data, split, token_counts


@dataclass
class Plan:
    """What a run will do, known before any compute (also what `--dry-run` prints)."""

    cfg: TrainConfig
    target: Any
    data: TrainData
    train_idx: list[int]
    eval_idx: list[int]
    head_summary: dict[str, Any]


def wandb_configured() -> bool:
    """The user has set wandb up: a mode or key in the environment, or a `wandb login`."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    settings = Path(os.environ.get("WANDB_CONFIG_DIR", Path.home() / ".config" / "wandb")) / "settings"
    try:
        return "api.wandb.ai" in netrc.read_text() or settings.is_file()
    except OSError:
        return settings.is_file()


def trackers(cfg: TrainConfig) -> list[str]:
    chosen = [t for t in cfg.trackers if t != "none"]
    if "wandb" in chosen:
        if importlib.util.find_spec("wandb") is None:
            raise HeadstartError(
                "trackers include wandb but wandb is not installed",
                "pip install wandb, or set trackers=[tensorboard]",
            )
        if not wandb_configured():  # a user who logged in (or chose a mode) keeps their setting
            os.environ["WANDB_MODE"] = "offline"
    if (
        "tensorboard" in chosen
        and importlib.util.find_spec("tensorboard") is None
        and importlib.util.find_spec("tensorboardX") is None
    ):
        raise HeadstartError(
            "trackers include tensorboard but it is not installed",
            "pip install tensorboard, or set trackers=[none]",
        )
    return chosen


def make_accelerator(cfg: TrainConfig) -> Any:
    from accelerate import Accelerator
    from accelerate.utils import (
        DataLoaderConfiguration,
        DistributedDataParallelKwargs,
        GradientAccumulationPlugin,
        ProjectConfiguration,
    )

    chosen = trackers(cfg)
    launched = launcher_world_size()
    # `accelerate launch` with a GPU config on a machine without GPUs starts N processes that
    # form no group unless told to use the CPU: then N independent runs would write one
    # output_dir. Form the CPU (gloo) group instead, as ACCELERATE_USE_CPU=1 would.
    cpu = cfg.cpu or (launched > 1 and not torch.cuda.is_available())
    if cpu and not cfg.cpu:
        logging.getLogger("headstart.train").info(
            "%d processes launched on a machine without CUDA: training on the CPU (gloo)", launched
        )
    from accelerate.state import AcceleratorState

    # accelerate keeps one process-wide state and refuses a second Accelerator with another
    # mixed precision: a second train() in one process (a notebook, the profile script, a test
    # after a bf16 run) would fail. Drop that state, never the process group (PartialState).
    AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=cfg.mixed_precision,
        # Accumulation crosses epoch ends, so `step * grad_accum` batches is exactly what was consumed.
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=cfg.grad_accum, sync_with_dataloader=False
        ),
        log_with=chosen or None,
        project_config=ProjectConfiguration(
            project_dir=cfg.output_dir, logging_dir=str(Path(cfg.output_dir) / "logs")
        ),
        # Medusa-2 warm-up leaves the LoRA weights without gradients.
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.lora.enabled)],
        # batches go to a GPU without a host sync (pinned by the loader: train/loop.py)
        dataloader_config=DataLoaderConfiguration(non_blocking=True),
    )
    if launched > 1 and accelerator.num_processes != launched:
        raise HeadstartError(
            f"the launcher started {launched} processes but they formed a group of "
            f"{accelerator.num_processes} ({accelerator.distributed_type}): each would train alone "
            "into the same output_dir",
            "check the accelerate config (distributed_type, num_processes), or run `headstart train` "
            "without `accelerate launch`",
        )
    return accelerator


def launcher_world_size() -> int:
    """How many processes `accelerate launch`/torchrun started (WORLD_SIZE; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def plan(cfg: TrainConfig, device: str = "cpu", data: TrainData | None = None, target: Any = None) -> Plan:
    """Load the target and the data and check that everything fits; no forward pass."""
    from headstart.logs import quiet_transformers
    from headstart.targets import load_target

    # the start-up's stages and their times in one line once both are done (an error stays one
    # line); a start that hangs shows where by its interrupt line or `kill -USR1` (headstart/cli.py)
    since = time.perf_counter()
    done = []
    if target is None:
        with quiet_transformers():
            target = load_target(cfg.target, dtype=cfg.dtype, device=device)
        done.append(f"target {cfg.target} loaded on {device} in {time.perf_counter() - since:.1f} s")
    if data is None:
        since = time.perf_counter()
        data = load_distilled_data(cfg.data)
        done.append(f"{len(data)} conversations read in {time.perf_counter() - since:.1f} s")
    if done:
        logging.getLogger("headstart.train").info("; ".join(done))
    config = head_config(cfg.head, target)  # raises when the head does not fit the target
    check_data(data, target, config.feature_layers, cfg.data.mode)
    assert cfg.data.holdout is not None  # DataConfig fills the default in
    train_idx, eval_idx = split(data.train_count, cfg.data.holdout, cfg.seed)
    eval_idx += list(range(data.train_count, len(data)))  # eval_path: held out by construction
    if len(train_idx) < cfg.batch_size:
        raise HeadstartError(
            f"only {len(train_idx)} training conversations for batch_size={cfg.batch_size}",
            "lower batch_size or data.holdout, or distil more data",
        )
    summary = {k: v for k, v in to_dict(cfg.head).items()} | {
        "feature_layers": config.feature_layers,
        "draft_vocab_size": config.draft_vocab_size,
    }
    return Plan(cfg, target, data, train_idx, eval_idx, summary)


def make_head(p: Plan) -> Any:
    """A fresh head, or (init_from) the saved one; fp32 master weights under mixed precision."""
    head = initial_head(p) if p.cfg.init_from else fresh_head(p)
    if p.cfg.mixed_precision != "no":
        head.float()  # master weights in fp32; accelerate's autocast runs the maths in bf16/fp16
    head = freeze(head.train().requires_grad_(True), p.cfg.optim.freeze)
    if hasattr(head, "before_training"):  # the kind's own preparation (a draft model's LoRA adapters)
        head.before_training(p.cfg.head)
    return head


def freeze(head: Any, prefixes: list[str]) -> Any:
    """Stop the head parameters named by `prefixes` (optim.freeze) from training."""
    params = dict(head.named_parameters())
    for prefix in prefixes:
        hit = [n for n in params if n == prefix or n.startswith(prefix.rstrip(".") + ".")]
        if not hit:
            top = sorted({n.split(".")[0] for n in params})
            raise HeadstartError(
                f"optim.freeze names '{prefix}', which is no parameter of this {head.kind} head",
                f"use a name or prefix of its parameters: {', '.join(top)}",
            )
        for name in hit:
            params[name].requires_grad_(False)
    return head


def fresh_head(p: Plan) -> Any:
    counts = None
    if p.cfg.head.draft_vocab_size:  # the draft vocabulary: the most frequent training tokens
        counts = token_counts(p.data, p.train_idx, p.target.vocab_size)
    return build_head(p.cfg.head, p.target, token_counts=counts, seed=p.cfg.seed)


VOCAB_MAPS = ("d2t", "t2d")


def initial_head(p: Plan) -> Any:
    """The heads at cfg.init_from, checked against the target and the recipe's head spec."""
    from headstart.heads import load_heads
    from headstart.heads.config import HeadConfig
    from headstart.heads.formats import detect_format

    path = p.cfg.init_from
    assert path is not None
    if not (Path(path) / "config.json").is_file():
        raise HeadstartError(
            f"init_from={path} is not a saved head (no config.json)",
            "point init_from at a directory written by headstart train (output_dir/final)",
        )
    # a published head (speculators, EAGLE-3, Medusa formats) is imported as --heads imports it:
    # fine-tune it, or score it with max_steps=0 by the same evaluator as headstart's own
    foreign = detect_format(path) != "headstart"
    saved = load_heads(path, p.target) if foreign else None
    wanted = head_config(p.cfg.head, p.target)
    found = saved.config if saved is not None else HeadConfig.read(path)
    from headstart import kinds

    # a warm start from another layout of the same kind that the recipe's class rebuilds from
    wanted_class = kinds.get(wanted.kind).head_class(wanted.layout)
    relayout = (
        wanted.kind == found.kind
        and found.layout != wanted.layout
        and found.layout in wanted_class.relayout_from
    )
    free = wanted_class.relayout_from[found.layout] if relayout else kinds.get(wanted.kind).free_on_init
    # the structure a checkpoint must share with the recipe's head to continue from it
    # (HeadConfig.shape; a Medusa draft vocabulary only picks rows at drafting time: free_on_init)
    shape = dict.fromkeys(wanted.shape() + found.shape())
    diff = [f"{k}: recipe {getattr(wanted, k, None)!r}, heads {getattr(found, k, None)!r}" for k in shape
            if k not in free and list_or(getattr(wanted, k, None)) != list_or(getattr(found, k, None))]  # fmt: skip
    if diff:
        raise HeadstartError(
            f"init_from={path} does not match the recipe's head ({'; '.join(diff)})",
            "set head.* in the recipe to the saved heads' shape, or start without init_from",
        )
    if saved is None:
        saved = load_heads(path, p.target)  # checks the target fingerprint, binds
    if relayout:  # its scales measured on the first training conversations (8 target forwards)
        conversations = [torch.tensor(p.data.input_ids[j][: p.cfg.data.max_length]) for j in p.train_idx[:8]]
        head = wanted_class.relayout(
            saved.to(dtype=torch.float32), fresh_head(p).float(), p.target, conversations
        )
        return head.to(dtype=p.target.dtype)
    if wanted.draft_vocab_size == found.draft_vocab_size:
        return saved.to(dtype=p.target.dtype)
    # Medusa with a new draft vocabulary: the saved weights in a head built with the recipe's
    head = fresh_head(p)
    weights = {k: v for k, v in saved.state_dict().items() if k not in VOCAB_MAPS}
    missing, unexpected = head.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= set(VOCAB_MAPS), (missing, unexpected)
    head.config.training = dict(saved.config.training)
    return head


def list_or(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def add_lora(cfg: TrainConfig, target_model: Any) -> Any:
    """Medusa-2: the target with trainable LoRA adapters (base weights stay frozen)."""
    if importlib.util.find_spec("peft") is None:
        raise HeadstartError(
            "lora.enabled (Medusa-2) needs peft, which is not installed", "pip install 'headstart[lora]'"
        )
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in target_model.named_modules()}
    missing = [m for m in cfg.lora.target_modules if m not in names]
    if missing:
        raise HeadstartError(
            f"lora.target_modules {missing} are not modules of the target", "use names like q_proj, v_proj"
        )
    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
    )
    return get_peft_model(target_model, lora)


# optim.schedule -> transformers' scheduler names (linear warmup first in each)
SCHEDULES = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter] | list[tuple[str, torch.nn.Parameter]]
                   ) -> tuple[Any, Any]:  # fmt: skip
    """AdamW (or Muon with AdamW: optim.name) and transformers' `get_scheduler` (warmup, then
    constant, cosine or linear decay to 0 at max_steps), or headstart's warmup-stable-decay
    (train/schedule.py); their state is saved with every checkpoint and restored on resume.
    `params`: (name, parameter) pairs (Muon's split goes by name), or bare parameters."""
    from transformers import get_scheduler

    named = [item if isinstance(item, tuple) else ("", item) for item in params]
    o = cfg.optim
    if o.name == "muon":
        from headstart.train.optimizers import MuonAdamW

        optimizer: Any = MuonAdamW(named, o.lr, o.muon_lr, o.weight_decay, tuple(o.betas), o.momentum)
    else:
        optimizer = torch.optim.AdamW(
            [q for _, q in named], lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas)
        )
    if cfg.optim.schedule == "wsd":
        from headstart.train.schedule import WarmupStableDecay

        return optimizer, WarmupStableDecay(optimizer, cfg.optim.warmup_steps, cfg.max_steps, cfg.optim.decay)
    scheduler = get_scheduler(
        SCHEDULES[cfg.optim.schedule],
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps,
        num_training_steps=max(1, cfg.max_steps),
    )
    return optimizer, scheduler

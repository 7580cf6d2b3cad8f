"""Logging: training loss windows, held-out top-1/top-k per head or unroll step, the estimated
acceptance length, accelerate trackers and the results file. Sums stay on device until log time."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from headstart.io import atomic_write_text
from headstart.train.losses import acceptance_length

log = logging.getLogger(__name__)


def flat_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Trackers take flat scalar hyper-parameters: nested keys dotted, lists as strings."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, int | float | str | bool) else str(value)
    return flat


def part_names(cfg: Any) -> list[str]:
    """Names of the loss parts an Objective returns, in order (the kind's objective names them)."""
    from headstart import kinds

    return kinds.load(kinds.get(cfg.head.kind).objective).parts(cfg)


def log_train(
    accelerator: Any,
    step: int,
    window: list[torch.Tensor],
    parts: list[torch.Tensor],
    names: list[str],
    lr: float,
) -> dict[str, Any]:
    """Mean loss over the window, averaged across processes (cost: one collective + one sync)."""
    loss = accelerator.reduce(torch.stack(window).mean(), "mean")
    mean_parts = accelerator.reduce(torch.stack(parts).mean(0), "mean").tolist()
    logged = {"kind": "train", "step": step, "loss": float(loss.item()), "lr": lr}
    logged.update({f"train/{n}": float(v) for n, v in zip(names, mean_parts, strict=True)})
    accelerator.log(
        {k: v for k, v in logged.items() if k not in ("kind", "step")} | {"train/loss": logged["loss"]},
        step=step,
    )
    return logged


@torch.no_grad()
def evaluate(accelerator: Any, model: Any, loader: Any, cfg: Any, step: int, joint: bool) -> dict[str, Any]:
    """Held-out top-1 / top-k per head (Medusa) or unroll step (EAGLE) and the estimated
    acceptance length (tokens per target forward, bonus token included)."""
    model.eval()
    hits, loss_sum, batches = None, None, 0
    for i, batch in enumerate(loader):
        if cfg.eval_batches and i >= cfg.eval_batches:
            break
        out = model(batch, evaluate=True, joint=joint)
        # gather_for_metrics drops the duplicates accelerate pads the last batch with (cost: a collective)
        batch_hits = accelerator.gather_for_metrics(out["hits"]).sum(0)  # (S, 3) on device
        hits = batch_hits if hits is None else hits + batch_hits
        loss_sum = out["loss"].detach() if loss_sum is None else loss_sum + out["loss"].detach()
        batches += 1
    if hits is None:
        return {"kind": "eval", "step": step}
    hits = hits.cpu()  # cost: device->host copy
    buckets = hits[:, 1:] if hits.dim() == 3 else None  # (S, K, 3): per context bucket
    hits = hits[:, 0] if hits.dim() == 3 else hits  # (S, 3): a kind's own counts may have no buckets
    loss = accelerator.reduce(loss_sum / batches, "mean").item()
    from headstart import kinds

    label = kinds.get(cfg.head.kind).metric_step
    offset = 1 if label == "head" else 0
    result: dict[str, Any] = {
        "kind": "eval",
        "step": step,
        "eval/loss": loss,
        "eval/predictions": int(hits[0, 2]),
    }
    top1 = []
    for j, (hit1, hitk, count) in enumerate(hits.tolist()):
        acc1, acck = hit1 / max(count, 1.0), hitk / max(count, 1.0)
        top1.append(acc1)
        result[f"eval/top1/{label}{j + offset}"] = acc1
        result[f"eval/top{cfg.topk}/{label}{j + offset}"] = acck
    result["eval/accept_len_est"] = acceptance_length(top1)
    if buckets is not None:
        result["eval/by_position"] = by_position(buckets)
    if accelerator.is_main_process:  # as it comes: a run cut short still says how far it got
        log.info(eval_line(result, top1))
    scalars = {k: v for k, v in result.items() if k not in ("kind", "step", "eval/by_position")}
    for name, figures in result.get("eval/by_position", {}).items():  # trackers take scalars
        scalars[f"eval/accept_len_est/{name}"] = figures["accept_len_est"]
    accelerator.log(scalars, step=step)
    return result


def by_position(buckets: torch.Tensor) -> dict[str, dict[str, Any]]:
    """{bucket: {"predictions", "top1" per step, "accept_len_est"}} for the context buckets the
    held-out set reaches (counts (S, K, 3) of [top-1 hits, top-k hits, predictions]), so a run
    shows where its head stops paying (bench reports the same buckets for a decode)."""
    from headstart.train.losses import bucket_names

    figures = {}
    for k, name in enumerate(bucket_names()):
        counts = buckets[:, k].tolist()
        if not counts[0][2]:
            continue
        top1 = [hit1 / max(count, 1.0) for hit1, _, count in counts]
        figures[name] = {"predictions": int(counts[0][2]), "top1": [round(a, 4) for a in top1],
                         "accept_len_est": round(acceptance_length(top1), 4)}  # fmt: skip
    return figures


def eval_line(result: dict[str, Any], top1: list[float]) -> str:
    """One line for the log: `eval step 500: accept_len_est 1.69, top-1 0.43/0.36, loss 9.10`."""
    line = (
        f"eval step {result['step']}: accept_len_est {result['eval/accept_len_est']:.3f}, "
        f"top-1 {'/'.join(f'{a:.3f}' for a in top1)}, loss {result['eval/loss']:.4f}"
    )
    buckets = result.get("eval/by_position") or {}
    if len(buckets) > 1:  # one bucket says nothing the total does not
        line += "; by position " + ", ".join(
            f"{name} {f['accept_len_est']:.2f}" for name, f in buckets.items()
        )
    return line


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic JSON write (temp file in the same directory + os.replace)."""
    atomic_write_text(path, json.dumps(data, indent=2))

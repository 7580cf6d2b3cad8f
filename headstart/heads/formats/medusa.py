"""vLLM's Medusa layout: config.json (`model_type: medusa`, `num_heads`, `num_hidden_layers`,
`truncated_vocab_size`, `original_lm_head`) and weights `blocks.K.layers.J.*`, `lm_heads.K.weight`
or one `lm_head.weight`, `token_map` for a draft vocabulary. On import, also the Medusa repo's
`medusa_lm_head.*` names (`K.J.linear.*`, `medusa_num_heads`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig

FILES = frozenset({"config.json", "model.safetensors"})


def detects(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "medusa" or "medusa_num_heads" in config


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats.common import writer

    return writer(*_medusa_export(head), dtype)


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    return _medusa_import(directory, config, target)


def _medusa_export(head: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config: HeadConfig = head.config
    if config.kind != "medusa":
        raise HeadstartError(
            f"the medusa format holds Medusa heads, not {config.kind}", "use --format speculators or eagle"
        )
    state: dict[str, torch.Tensor] = {}
    for k, blocks in enumerate(head.heads):
        for j, block in enumerate(blocks):
            state[f"blocks.{k}.layers.{j}.weight"] = block.linear.weight
            state[f"blocks.{k}.layers.{j}.bias"] = block.linear.bias
    if head.lm_heads is not None:
        for k, proj in enumerate(head.lm_heads):
            state[f"lm_heads.{k}.weight"] = proj.weight
    else:  # the target's lm_head, which the heads share: vLLM loads it from the draft checkpoint
        state["lm_head.weight"] = head.projection(0).weight
    truncated = config.vocab_size
    if getattr(head, "has_draft_vocab", False):
        state["token_map"] = head.draft_ids()
        truncated = config.draft_vocab_size
    medusa = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "medusa_num_heads": config.num_heads,  # the Medusa repo's names for the same two numbers
        "medusa_num_layers": config.num_layers,
        "truncated_vocab_size": truncated,
        "original_lm_head": head.lm_heads is None,
        "medusa_fc_bias": True,
        "max_paths": 64,
        "topk": 10,
    }
    return medusa, state


MEDUSA_REPO = re.compile(r"^(?:medusa_heads?\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)$")


def _medusa_import(directory: Path, config: dict[str, Any], target: Any) -> Any:
    from headstart.heads.files import read_weights
    from headstart.heads.formats.common import mismatch
    from headstart.heads.medusa import MedusaHeads

    num_heads = int(config.get("medusa_num_heads") or config.get("num_heads") or 0)
    # medusa_* first: community checkpoints ship the base model's config plus these two keys,
    # where num_hidden_layers is the target's depth, not the heads'
    num_layers = int(config.get("medusa_num_layers") or config.get("num_hidden_layers") or 1)
    if num_heads < 1:
        raise HeadstartError(
            f"{directory}/config.json names no Medusa heads", "set num_heads or medusa_num_heads"
        )
    mismatch(
        directory, "hidden size", int(config.get("hidden_size") or target.hidden_size), target.hidden_size
    )
    mismatch(directory, "vocabulary", int(config.get("vocab_size") or target.vocab_size), target.vocab_size)
    raw = read_weights(
        directory,
        ("model.safetensors", "medusa_lm_head.safetensors", "pytorch_model.bin", "medusa_lm_head.pt"),
    )
    state = _medusa_names(raw, num_layers)
    lm = target.model.get_output_embeddings().weight.detach().cpu()
    if "lm_head.weight" in state:  # vLLM's original_lm_head: one projection for every head
        weight = state.pop("lm_head.weight")
        if weight.shape != lm.shape or not torch.equal(lm.to(weight.dtype), weight):  # not the target's own
            state.update({f"lm_heads.{k}.weight": weight for k in range(num_heads)})
    token_map = state.pop("token_map", None)
    head_config = HeadConfig.for_target(
        target,
        "medusa",
        num_heads=num_heads,
        num_layers=num_layers,
        shared_lm_head=not any(k.startswith("lm_heads.") for k in state),
        draft_vocab_size=target.vocab_size if token_map is None else int(token_map.numel()),
        training={"imported_from": f"{directory} (medusa)"},
    )
    head = MedusaHeads(head_config)
    if token_map is not None:  # the maps are set from the token map, not read
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    from headstart.heads.files import load_checked

    load_checked(head, state, directory)
    if token_map is not None:
        head.set_draft_vocab(token_map)
    return head


def _medusa_names(raw: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """vLLM's (blocks.K.layers.J, lm_heads.K) or the Medusa repo's (K.J.linear, K.<layers>) names
    as headstart's (heads.K.J.linear, lm_heads.K)."""
    state: dict[str, torch.Tensor] = {}
    for name, value in raw.items():
        name = name.removeprefix("medusa_heads.")
        vllm = re.match(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$", name)
        repo = MEDUSA_REPO.match(name)
        if vllm:
            state[f"heads.{vllm[1]}.{vllm[2]}.linear.{vllm[3]}"] = value
        elif repo and int(repo[2]) == num_layers:  # the repo's per-head lm_head
            state[f"lm_heads.{repo[1]}.weight"] = value
        elif repo:
            state[f"heads.{repo[1]}.{repo[2]}.linear.{repo[3]}"] = value
        else:
            state[name] = value
    for key in [k for k in state if k.endswith(".linear.weight")]:  # vLLM's medusa_fc_bias=False
        state.setdefault(
            key[: -len("weight")] + "bias", torch.zeros(state[key].shape[0], dtype=state[key].dtype)
        )
    return state

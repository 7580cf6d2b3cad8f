"""z-lab's DFlash layout (`--format dflash`): a Qwen3 config.json at top level with
`architectures: ["DFlashDraftModel"]`, `block_size`, `num_target_layers` and `dflash_config`
{mask_token_id, target_layer_ids, block_size}; weights `fc`, `hidden_norm`, `layers.N.*`, `norm`.
llama.cpp's `convert_hf_to_gguf.py --target-model-dir TARGET` reads it (`--spec-type
draft-dflash`), as SGLang and z-lab's own code do. Attention in the block is bidirectional
(no `is_causal`), as headstart trains it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headstart.heads.formats import dflash_layout as dflash

FILES = frozenset({"config.json", "model.safetensors"})


def detects(config: dict[str, Any]) -> bool:
    named = "DFlashDraftModel" in (config.get("architectures") or [])
    return "speculators_model_type" not in config and ("dflash_config" in config or named)


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats.common import writer

    config = dflash.check_exportable(head, "dflash")
    zlab = {
        **dflash.layer_config(head),
        "architectures": ["DFlashDraftModel"],
        "block_size": config.block_size,
        "num_target_layers": int(config.target.get("num_layers") or 0),
        "dflash_config": {
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": list(config.feature_layers),  # z-lab's ids are headstart's (layer outputs)
            "block_size": config.block_size,
        },
    }
    return writer(zlab, dflash.state(head), dtype)


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    inner = config.get("dflash_config") or {}
    block_size = int(inner.get("block_size") or config.get("block_size") or 16)
    ids = inner.get("target_layer_ids") or config.get("target_layer_ids") or []
    layer = {k: v for k, v in config.items() if k not in ("block_size", "dflash_config", "num_target_layers")}
    layer.setdefault("model_type", "qwen3")
    return dflash.load_dflash(directory, "dflash", layer, block_size, int(inner.get("mask_token_id", -1)),
                              [int(i) for i in ids], target)  # fmt: skip

"""headstart's own checkpoint (config.json with `format: headstart-heads/1`, model.safetensors,
README.md) as an export: the same head at another dtype (how the shipped heads become bf16)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

FILES = frozenset({"config.json", "model.safetensors", "README.md"})


def detects(config: dict[str, Any]) -> bool:
    from headstart.heads.config import FORMAT

    return config.get("format") == FORMAT


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.checkpoint import write_checkpoint
    from headstart.heads.formats import torch_dtype

    return lambda directory: write_checkpoint(directory, head.config, head.state_dict(), torch_dtype(dtype))


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    from headstart.heads.build import head_class
    from headstart.heads.config import HeadConfig

    read = HeadConfig.read(directory)
    return head_class(read.kind, read.layout).from_pretrained(directory, target)

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
    from headstart.heads.formats.common import torch_dtype

    return lambda directory: write_checkpoint(directory, head.config, head.state_dict(), torch_dtype(dtype))


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    from headstart import kinds
    from headstart.heads.config import HeadConfig

    read = HeadConfig.read(directory)  # (the kind's class by the registry: heads/build.py imports formats)
    return kinds.get(read.kind).head_class(read.layout).from_pretrained(directory, target)

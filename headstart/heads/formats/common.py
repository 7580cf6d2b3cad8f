"""What the format adapters share: the writer of an engine format's two files, the dtype a
`--dtype` names, and the one-line refusal of a published head made for another target. (A module
of its own: the adapters import it, and formats/__init__.py, which loads the adapters by name,
re-exports it, so nothing imports the package back.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError


def writer(config: dict[str, Any], state: dict[str, torch.Tensor], dtype: str) -> Callable[[Path], None]:
    """Writes config.json (with its `torch_dtype`) and model.safetensors (floating tensors in
    `dtype`) into a directory: what every engine format's export is made of."""
    from safetensors.torch import save_file

    cast = torch_dtype(dtype)
    config = {**config, "torch_dtype": dtype}
    state = {
        k: (v.to(cast) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()
    }

    def write(directory: Path) -> None:
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})

    return write


def torch_dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise HeadstartError(f"unknown dtype '{name}'", "use bfloat16, float16 or float32")
    return value


def mismatch(path: Path, what: str, head: Any, target: Any) -> None:
    """One line when a published head's `what` differs from the target's."""
    if head != target:
        raise HeadstartError(
            f"{path} was made for a target with {what} {head}, this target has {target}",
            "load the target the head was trained for",
        )

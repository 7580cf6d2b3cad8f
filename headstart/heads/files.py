"""Reading a head directory's files, shared by headstart's own checkpoints and every format
adapter: its config.json, its weights (safetensors, sharded or not, or a PyTorch file read with
weights_only), and the one-line check that loaded weights fit the head built for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError

TUNED_FILE = "tuned_tree.json"
"""The tree `headstart tune` chose for a heads directory, stored in it (headstart/speculator.py reads it)."""


def read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise HeadstartError(
            f"no head checkpoint at {file.parent} (config.json missing)",
            "pass a directory written by headstart train or export, or a published head",
        )
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HeadstartError(
            f"{file} is not valid JSON ({err})", "restore or re-download the checkpoint"
        ) from None
    if not isinstance(data, dict):
        raise HeadstartError(f"{file} is not a JSON object", "restore or re-download the checkpoint")
    return data


def read_weights(
    directory: Path, names: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: sharded or single safetensors, or a PyTorch file read with
    weights_only (no pickled code runs). A damaged file is one clear line, not a traceback."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = (
        sorted(directory.glob("model-*-of-*.safetensors"))
        or [directory / n for n in names if (directory / n).is_file()][:1]
    )
    if not files:
        raise HeadstartError(
            f"no weights in {directory} (looked for {', '.join(names)})", "re-download or re-save the heads"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                state.update(load_file(str(file)))
            else:
                state.update(torch.load(file, map_location="cpu", weights_only=True))
        except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise HeadstartError(
                f"cannot read {file}: {reason}",
                "the file is damaged or truncated: re-download or re-save the heads",
            ) from None
    return state


def load_checked(head: Any, state: dict[str, torch.Tensor], directory: Path) -> None:
    own = head.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or wrong:
        detail = "; ".join(
            part
            for part in (
                f"missing {missing[:3]}" if missing else "",
                f"unexpected {unexpected[:3]}" if unexpected else "",
                f"shape of {wrong[0]}: {tuple(state[wrong[0]].shape)} vs {tuple(own[wrong[0]].shape)}"
                if wrong
                else "",
            )
            if part
        )
        raise HeadstartError(
            f"{directory} does not match a {head.kind} head for this target ({detail})",
            "check the head was made for this target",
        )
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})

"""Heads shipped inside the package for the embedded SmolLM2 target.

`headstart generate` and `headstart bench` use them when no `--heads` is given and the target is
the embedded `smollm2`. They were trained with the project's own recipes (see
headstart/default_heads/README.md for the commands, data and timings).
"""

from __future__ import annotations

from pathlib import Path

from headstart.targets import EMBEDDED_NAME

DEFAULT_HEADS_DIR = Path(__file__).resolve().parent.parent / "default_heads"
PREFERENCE = ("smollm2-eagle3", "smollm2-medusa")
"""The shipped heads' folders in order of preference: the first is what `generate` uses by default."""


def shipped_heads(target_spec: str) -> dict[str, Path]:
    """{label: directory} of the heads shipped for `target_spec` (empty for other targets)."""
    if target_spec != EMBEDDED_NAME:
        return {}
    found = {}
    for name in PREFERENCE:
        path = DEFAULT_HEADS_DIR / name
        if (path / "config.json").is_file():
            found[name] = path
    return found


def default_heads(target_spec: str) -> Path | None:
    """The preferred shipped heads for `target_spec`, or None."""
    heads = shipped_heads(target_spec)
    return next(iter(heads.values()), None)

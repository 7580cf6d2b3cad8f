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


def shipped_for_format(target_spec: str, fmt: str, kind: str | None = None) -> Path:
    """The shipped heads for `target_spec` that `headstart export --format fmt` writes: the
    `kind` asked for, else the first shipped kind the format can hold; one line when none fits."""
    from headstart import kinds
    from headstart.errors import HeadstartError
    from headstart.heads.config import HeadConfig

    shipped = {HeadConfig.read(folder).kind: folder for folder in shipped_heads(target_spec).values()}
    kind = kind or next((k for k in shipped if fmt in kinds.get(k).formats), None)
    if kind is None:
        raise HeadstartError(
            f"no shipped heads for target '{target_spec}' can be written as --format {fmt}",
            "pass a heads directory or Hub id",
        )
    if kind not in shipped:
        raise HeadstartError(
            f"no shipped {kind} heads for target '{target_spec}'"
            + (f" (shipped: {', '.join(shipped)})" if shipped else ""),
            f"use --kind {' or '.join(shipped)}" if shipped else "pass a heads directory or Hub id",
        )
    formats = kinds.get(kind).formats
    if fmt not in formats:
        raise HeadstartError(
            f"{kind} heads cannot be written as --format {fmt}",
            f"use --format {' or '.join(formats)}, or another --kind",
        )
    return shipped[kind]


def recorded_target(path: str | Path) -> str:
    """The target a headstart heads directory says it was trained for (its load spec: a Hub id,
    a path, smollm2), else smollm2 (the published formats name a verifier, not a loadable spec)."""
    from headstart.errors import HeadstartError
    from headstart.heads.config import HeadConfig

    try:
        name = HeadConfig.read(Path(str(path))).target.get("name")
    except HeadstartError:
        return EMBEDDED_NAME
    return name if isinstance(name, str) and name else EMBEDDED_NAME

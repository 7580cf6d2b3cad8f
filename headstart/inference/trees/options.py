"""`NAME:key=value,key=value` option lists (dynamic trees, Lookahead, drafters): each key named
once, each value of its key's type, no empty item (`window=4,,ngram=3` was read as two options and
the empty one dropped without a word)."""

from __future__ import annotations

import math

from headstart.errors import HeadstartError


def options(spec: str, text: str, keys: dict[str, type], usage: str) -> dict[str, int | float]:
    """{key: value} from `text` (what follows the ':' of `spec`), each value an int or a finite
    float as `keys` says; one line naming the item otherwise."""
    values: dict[str, int | float] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if not item.strip():
            raise HeadstartError(f"'{spec}' has an empty option (two commas, or one at an end)", usage)
        kind = keys.get(key)
        parsed = _parse(value, kind) if kind is not None else None
        if parsed is None:
            names = ", ".join(f"{name}={'N' if t is int else 'X'}" for name, t in keys.items())
            raise HeadstartError(f"bad option '{item}' in '{spec}' (options: {names})", usage)
        if key in values:
            raise HeadstartError(f"'{spec}' gives {key} twice", usage)
        values[key] = parsed
    return values


def int_options(spec: str, text: str, keys: tuple[str, ...], usage: str) -> dict[str, int]:
    """`options` whose every value is a whole number."""
    return options(spec, text, dict.fromkeys(keys, int), usage)  # type: ignore[return-value]


def _parse(value: str, kind: type) -> int | float | None:
    if kind is int:
        return int(value) if value.isascii() and value.isdigit() else None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and value.isascii() else None

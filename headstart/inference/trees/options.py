"""`NAME:key=value,key=value` option lists (dynamic trees, Lookahead, drafters): each key named
once, each value a whole number, no empty item (`window=4,,ngram=3` was read as two options and the
empty one dropped without a word)."""

from __future__ import annotations

from headstart.errors import HeadstartError


def int_options(spec: str, options: str, keys: tuple[str, ...], usage: str) -> dict[str, int]:
    """{key: int} from `options` (what follows the ':' of `spec`); one line naming the item otherwise."""
    values: dict[str, int] = {}
    for item in options.split(","):
        key, _, value = item.partition("=")
        if not item.strip():
            raise HeadstartError(f"'{spec}' has an empty option (two commas, or one at an end)", usage)
        if key not in keys or not (value.isascii() and value.isdigit()):
            raise HeadstartError(f"bad option '{item}' in '{spec}' (options: {', '.join(keys)}=N)", usage)
        if key in values:
            raise HeadstartError(f"'{spec}' gives {key} twice", usage)
        values[key] = int(value)
    return values

"""KV-cache surgery on transformers' DynamicCache: keep only accepted tree nodes, drop rows.

Every layer holds keys/values of shape (B, kv_heads, S, D). After verifying an n-node tree the
cache ends with n tree entries; `keep_entries` gathers the accepted path's entries into place and
drops the rest, so the cache never holds rejected branches. Rows of a batch accept different
path lengths: shorter rows get repeated entries that the caller masks out (`visible` is False),
which keeps the cache one rectangular tensor per layer (no per-row Python loops).
"""

from __future__ import annotations

from typing import Any

import torch

from headstart.errors import HeadstartError


def _layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise HeadstartError(
            f"unsupported KV cache {type(cache).__name__} (no .layers)",
            "use transformers >= 4.56 (DynamicCache)",
        )
    return [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0]


def cache_length(cache: Any) -> int:
    """Entries per row (the same for every layer)."""
    layers = _layers(cache)
    if layers and getattr(layers[0], "ends", None) is not None and layers[0].ends() is not None:
        return int(layers[0].ends())  # views a round program left unsliced (growing_cache.py)
    return int(layers[0].keys.shape[-2]) if layers else 0


def check_tree_compatible(cache: Any) -> None:
    """Layers that drop or fold old entries on update (a transformers sliding or chunked layer,
    recurrent state) break entry gathering; headstart's caches keep every entry."""
    odd = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])
                  if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys")})  # fmt: skip
    if odd:
        raise HeadstartError(
            f"the target's KV cache has {', '.join(odd)} layers, which drop entries the tree verifier moves",
            "use --no-heads for plain decoding with this target",
        )


def truncate(cache: Any, length: int) -> None:
    """Keep the first `length` entries of every layer (in place)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


def keep_entries(cache: Any, start: int, keep: torch.Tensor, in_place: bool | None = None) -> None:
    """Entries start + keep[b, j] move to start + j; everything after start + A is dropped.

    keep: (B, A) long offsets into the entries appended after `start`. In place: only the A
    kept entries are gathered and written back (cost O(A) per layer, not a copy of the prefix);
    the cache then views its first start + A entries. A path that is already in place (a chain,
    or a tree's first branch) moves nothing. `in_place`: the caller already knows (the decoder
    reads it back with its one transfer per step); None checks here (cost: one host sync)."""
    width = keep.shape[1]
    if in_place is None:
        in_place = bool((keep == torch.arange(width, device=keep.device)).all())
    for layer in _layers(cache):
        if not in_place:
            index = keep[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            kept_k = layer.keys[:, :, start:].gather(2, index)  # (B, kv_heads, A, D), a copy
            kept_v = layer.values[:, :, start:].gather(2, index)
            layer.keys[:, :, start : start + width] = kept_k
            layer.values[:, :, start : start + width] = kept_v
        layer.keys = layer.keys[:, :, : start + width]
        layer.values = layer.values[:, :, : start + width]


def select_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep batch rows `rows` (B',) of every layer (finished rows leave the batch)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[rows]
        layer.values = layer.values[rows]


def stack_rows(cache: Any, other: Any) -> None:
    """Append `other`'s rows under `cache`'s (in place), both left-padded with zero entries to the
    wider one's width: the caller's `visible` masks hide the padding (rows joining a live batch)."""
    mine, theirs = _layers(cache), _layers(other)
    if not mine:  # nothing cached yet on this side: take the other's layers as they are
        for layer, src in zip(getattr(cache, "layers", []), getattr(other, "layers", []), strict=False):
            if getattr(src, "keys", None) is not None:
                layer.lazy_initialization(src.keys, src.values)
                layer.keys, layer.values = src.keys, src.values
        return
    if len(mine) != len(theirs):
        raise HeadstartError("cannot stack caches of different depth", "build both with the same model")
    width = max(mine[0].keys.shape[-2], theirs[0].keys.shape[-2])
    for layer, src in zip(mine, theirs, strict=True):
        for name in ("keys", "values"):
            stacked = torch.cat(
                [_pad_entries(getattr(layer, name), width), _pad_entries(getattr(src, name), width)]
            )
            setattr(layer, name, stacked)  # a fresh tensor: a growing layer starts a new buffer
        for buffer in ("_key_buffer", "_value_buffer"):
            if hasattr(layer, buffer):
                setattr(layer, buffer, None)


def _pad_entries(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, H, n, D) -> (B, H, width, D) with zero entries on the left."""
    missing = width - x.shape[-2]
    if missing <= 0:
        return x
    return torch.cat([x.new_zeros(*x.shape[:-2], missing, x.shape[-1]), x], dim=-2)


def drop_left(cache: Any, count: int) -> None:
    """Forget every layer's first `count` entries (columns no row sees any more)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, count:]
        layer.values = layer.values[:, :, count:]

"""A DynamicCache whose layers append in place instead of concatenating.

transformers' DynamicLayer appends with `torch.cat([keys, new])`: every forward copies each
layer's whole cache (O(context) per step, 2 x layers copies). Here keys/values are views of a
buffer with spare room; an update writes the new entries after the view (O(new entries)) and
re-views, reallocating with 25% headroom only when the room runs out (amortised O(1) per entry).
The cache surgery in headstart.inference.cache keeps working unchanged: it writes into the views
(in place) and re-slices them, which keeps them prefixes of the buffer; a row selection makes a
fresh tensor, and the next update simply starts a new buffer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def _append(
    view: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor, reserve: int = 0,
    pool: torch.Tensor | None = None, zeroed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(view + new as a prefix view of a buffer, that buffer); view (B, H, n, D), new (B, H, m, D).
    `reserve`: the first buffer holds at least this many entries (a preallocated cache).
    `pool`: a buffer to start in when a new one is needed and it fits (a captured verify's
    buffers, reused across calls so the graph's addresses stay put). `zeroed`: new buffers start
    as zeros, not uninitialised memory (a captured verify attends over every column, masked, and
    a masked NaN still poisons the softmax)."""
    n = view.shape[-2] if view.dim() == 4 else 0
    m = new.shape[-2]
    in_buffer = (
        buffer is not None
        and n > 0
        and view.data_ptr() == buffer.data_ptr()
        and view.stride() == buffer.stride()
        and view.shape[:2] == buffer.shape[:2] == new.shape[:2]
        and view.shape[-1] == buffer.shape[-1]
        and view.dtype == buffer.dtype
    )
    if not in_buffer and _fits(pool, new, max(reserve, n + m)):
        assert pool is not None
        if n:
            if view.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr():
                view = view.clone()  # a shifted view of the pool itself (cost: one copy)
            pool[:, :, :n] = view
        buffer = pool
    elif not in_buffer or n + m > buffer.shape[-2]:  # type: ignore[union-attr]
        capacity = max(reserve, n + m + max(64, (n + m) // 4))  # cost: one copy per 25% growth
        allocate = new.new_zeros if zeroed else new.new_empty
        grown = allocate(*new.shape[:-2], capacity, new.shape[-1])
        if n:
            grown[:, :, :n] = view
        buffer = grown
    assert buffer is not None
    buffer[:, :, n : n + m] = new  # in place: beyond every live view's end
    return buffer[:, :, : n + m], buffer


def _fits(pool: torch.Tensor | None, new: torch.Tensor, entries: int) -> bool:
    return (
        pool is not None
        and pool.shape[:2] == new.shape[:2]
        and pool.shape[-1] == new.shape[-1]
        and pool.shape[-2] >= entries
        and pool.dtype == new.dtype
        and pool.device == new.device
    )


@functools.cache
def growing_layer_class() -> type | None:
    """A DynamicLayer subclass appending in place, or None on transformers without DynamicLayer."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None

    class GrowingLayer(DynamicLayer):  # type: ignore[misc, valid-type]
        _key_buffer: torch.Tensor | None = None
        _value_buffer: torch.Tensor | None = None
        reserve: int = 0  # entries to preallocate (0: grow as needed)
        pool: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, values) buffers to start in
        zeroed: bool = False  # new buffers start as zeros (a captured verify reads every column)
        # the length the views end at when a compiled round wrote past them (`end_at`), sliced
        # only when keys or values are next read: a round program leaves no slicing per layer
        # behind it (2 x layers view ops a round on the host, ~60 for SmolLM2)
        _ends: int | None = None

        @property
        def keys(self) -> Any:
            if self._ends is not None:
                self._slice()
            return self.__dict__.get("_keys")

        @keys.setter
        def keys(self, value: Any) -> None:
            if self._ends is not None:
                self._slice()
            self.__dict__["_keys"] = value

        @property
        def values(self) -> Any:
            if self._ends is not None:
                self._slice()
            return self.__dict__.get("_values")

        @values.setter
        def values(self, value: Any) -> None:
            if self._ends is not None:
                self._slice()
            self.__dict__["_values"] = value

        def end_at(self, length: int) -> None:
            """The views end after `length` entries of the buffers (written there in place)."""
            self._ends = length

        def ends(self) -> int | None:
            """The length `end_at` set and no read has sliced yet (None: the views are current)."""
            return self._ends

        def _slice(self) -> None:
            length, self._ends = self._ends, None
            assert self._key_buffer is not None and self._value_buffer is not None
            self.__dict__["_keys"] = self._key_buffer[:, :, :length]
            self.__dict__["_values"] = self._value_buffer[:, :, :length]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            pool = self.pool or (None, None)
            self.keys, self._key_buffer = _append(
                self.keys, self._key_buffer, key_states, self.reserve, pool[0], self.zeroed
            )
            self.values, self._value_buffer = _append(
                self.values, self._value_buffer, value_states, self.reserve, pool[1], self.zeroed
            )
            return self.keys, self.values

        def reset(self) -> None:
            if self._ends is not None:
                self._slice()  # the views first: the base class resets what they hold
            self._key_buffer = self._value_buffer = None
            super().reset()

    return GrowingLayer


def growing_cache(config: Any, reserve: int = 0) -> Any:
    """DynamicCache(config) with its full-attention AND sliding-window layers appending in place
    and keeping every entry: a windowed layer that dropped its oldest entries itself would break
    the tree surgery (entries moved by index); the window is the mask's job instead (see
    headstart.targets.layer_kinds). Other special layers are left as transformers made them."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    layer_class = growing_layer_class()
    layers = getattr(cache, "layers", None)
    if layer_class is None or not isinstance(layers, list):
        return cache
    base = layer_class.__mro__[1]
    cache.layers = [layer_class() if _attention_layer(layer, base) else layer for layer in layers]
    for layer in cache.layers:
        if isinstance(layer, layer_class):
            layer.reserve = reserve  # one allocation per layer for the whole generation
    return cache


def _attention_layer(layer: Any, base: type) -> bool:
    """transformers' DynamicLayer or its sliding-window subclass (nothing else that subclasses it)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return type(layer) in (base, DynamicSlidingWindowLayer)

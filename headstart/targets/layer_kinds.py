"""What kind of attention each decoder layer runs, and the tree masks that follow from it.

transformers names every layer's kind in the decoder config (`layer_types`, or a `sliding_window`
for every layer); its own caches and masks are built from that list. headstart reads the same list
(`transformers.cache_utils.get_layer_types_and_kwargs`), so a family needs no code here:

* full_attention: a tree node sees the committed tokens and its own ancestors.
* sliding_attention (window W): the same, restricted to the LAST W tokens it sees. A node's visible
  keys are always its own context in order (the committed tokens, then its ancestors), so "the
  last W visible keys" is exactly transformers' `kv_idx > q_idx - W` at batch 1, and stays right
  for left-padded rows and for caches whose columns the batcher moved around.

The cache keeps every entry of a windowed layer (headstart.targets.growing_cache): the window is
enforced by the mask, so committing the accepted path and dropping rejected nodes works the same
for every layer. Cost: a windowed layer holds the whole context instead of W entries.

Anything else (chunked attention, linear attention, recurrent or convolutional state, shared
KV) cannot be verified as a tree by masking: `check_tree_verifiable` says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class LayerKinds:
    kinds: tuple[str, ...]  # per decoder layer, transformers' names
    window: int | None  # the sliding layers' window (None: no sliding layer)

    @property
    def sliding(self) -> bool:
        return SLIDING in self.kinds

    @property
    def unsupported(self) -> list[str]:
        return sorted({kind for kind in self.kinds if kind not in (FULL, SLIDING)})


def read_layer_kinds(config: Any) -> LayerKinds:
    """The decoder's per-layer attention kinds, as transformers' DynamicCache reads them."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    kinds, kwargs = get_layer_types_and_kwargs(text)
    if isinstance(kwargs, dict):  # transformers <= 5.17: one kwargs dict shared by every layer
        kwargs = [kwargs] * len(kinds)
    windows = {int(kw["sliding_window"]) for kind, kw in zip(kinds, kwargs, strict=True) if kind == SLIDING}
    if len(windows) > 1:
        raise HeadstartError(
            f"this target's sliding layers use different windows {sorted(windows)}",
            "use --no-heads for plain decoding with this target",
        )
    return LayerKinds(tuple(kinds), windows.pop() if windows else None)


def layer_kinds(model: nn.Module) -> LayerKinds:
    """`read_layer_kinds` of a loaded model (read once per model: every forward asks)."""
    kinds = model.__dict__.get("_headstart_layer_kinds")
    if kinds is None:
        kinds = read_layer_kinds(model.config)
        model.__dict__["_headstart_layer_kinds"] = kinds
    return kinds


def check_tree_verifiable(model: nn.Module) -> None:
    """Refuse, in one line, a target whose layers a tree mask cannot verify exactly."""
    bad = layer_kinds(model).unsupported
    if bad:
        raise HeadstartError(
            f"{type(model).__name__} has {', '.join(bad)} layers, whose state a tree of drafts cannot "
            "share (only full and sliding-window attention layers can be verified exactly)",
            "use --no-heads for plain decoding with this target",
        )


def windowed(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A 4D mask (B, 1, T, S), additive float (0 = visible) or boolean (True = visible),
    restricted to each query's last `window` visible keys."""
    visible = mask if mask.dtype == torch.bool else mask == 0
    # keys at or after column j that the query sees: the last `window` of them stay visible
    seen_from = visible.flip(-1).cumsum(-1).flip(-1)  # (B, 1, T, S)
    keep = visible & (seen_from <= window)
    if mask.dtype == torch.bool:
        return keep
    return torch.where(keep, mask, torch.finfo(mask.dtype).min)


def layer_masks(model: nn.Module, mask: Any) -> Any:
    """What to pass as `attention_mask` for a 4D tree mask: the mask itself where every layer is
    full attention, the windowed mask where every layer slides, and transformers' per-kind
    mapping ({"full_attention": ..., "sliding_attention": ...}) where they are mixed."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return mask
    kinds = layer_kinds(model)
    if not kinds.sliding:
        return mask
    check_tree_verifiable(model)
    assert kinds.window is not None
    local = windowed(mask, kinds.window)
    if all(kind == SLIDING for kind in kinds.kinds):
        return local
    return {FULL: mask, SLIDING: local}


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder's block list, found structurally (no per-architecture code)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise HeadstartError(
            f"cannot find the decoder layers of {type(model).__name__} (no .get_decoder().layers)",
            "use a decoder-only transformers model (Llama, Qwen2, Mistral, Gemma, ...)",
        )
    return layers

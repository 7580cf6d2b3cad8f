"""Feature capture and the tree-ready forward of the target.

Layer-id convention (used by every head, config and checkpoint in headstart):
    layer id `i` (0 <= i < num_layers) is the OUTPUT of decoder layer `i`, i.e. the residual stream
    after `i + 1` blocks. For `i < num_layers - 1` this equals `output_hidden_states[i + 1]`
    (index 0 there is the embeddings). For the last layer, HF's `hidden_states[-1]` is usually the
    final-norm output while our id `num_layers - 1` is the raw block output; the post-norm state
    that feeds the lm_head is `Features.last_hidden`.
    EAGLE-3's reference taps the INPUTS of layers 2, L//2 and L-3; in our convention those are ids
    1, L//2 - 1 and L - 4 (`eagle3_layer_ids`).

Only the requested layers are kept: forward hooks copy their outputs, so asking for three layers
never materialises all L + 1 hidden states the way `output_hidden_states=True` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.targets.layer_kinds import decoder_layers


@dataclass
class Features:
    """One target forward: logits, the lm_head input, and requested layers' outputs."""

    logits: torch.Tensor  # (B, T, V); (B, k, V) with logits_to_keep=k; training may leave it None
    last_hidden: torch.Tensor  # (B, T, H): the exact input of the lm_head (post final norm)
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # id -> (B, T, H)
    past_key_values: Any = None


def eagle3_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Low/middle/high taps matching the EAGLE-3 reference (inputs of 2, L//2, L-3)."""
    return (
        (1, num_layers // 2 - 1, num_layers - 4) if num_layers >= 5 else (0, num_layers // 2, num_layers - 1)
    )


def check_layer_ids(model: nn.Module, layer_ids: Sequence[int]) -> None:
    count = len(decoder_layers(model))
    bad = [i for i in layer_ids if not 0 <= int(i) < count]
    if bad:
        raise HeadstartError(
            f"layer ids {bad} out of range for a target with {count} layers",
            f"use ids 0..{count - 1} (id i = output of decoder layer i)",
        )


@functools.cache
def cache_keyword(function: Any) -> str:
    """The name transformers' `function` takes the KV cache under: `cache` from transformers 5.2x
    (`past_key_values` is deprecated there, removed in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache of a transformers model output (`cache`, or `past_key_values` before 5.2x)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def new_cache(model: nn.Module, reserve: int = 0) -> Any:
    """An empty KV cache for the target: a transformers DynamicCache whose attention layers, full
    and sliding-window alike, keep every entry and append in place (headstart.targets.growing_cache;
    no whole-cache copy per forward; windows are applied by the mask, see targets/layer_kinds.py).
    `reserve` entries are allocated up front (the decoder: prompt + new tokens + one tree), so the
    buffers never move: commit is an index copy into them, rollback a shorter view."""
    from headstart.targets.growing_cache import growing_cache

    return growing_cache(model.config, reserve)


def tree_attention_mask(
    prefix_visible: torch.Tensor, tree_visible: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The 4D additive mask for verifying new tokens (a tree, or a chain) after a cached prefix.

    prefix_visible: (B, P) bool, which cached positions every new token may see (False = padding).
    tree_visible:   (n, n) or (B, n, n) bool, node i may see node j (its ancestors and itself).
    Returns (B, 1, n, P + n) float with 0 where visible and the dtype's minimum elsewhere; we use
    the finite minimum rather than -inf so a fully masked (padding) row gives zeros, not NaN.
    """
    batch, n = prefix_visible.shape[0], tree_visible.shape[-1]
    if tree_visible.dim() == 2:
        tree_visible = tree_visible.expand(batch, n, n)
    visible = torch.cat([prefix_visible[:, None, :].expand(batch, n, -1), tree_visible], dim=-1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]  # (B, 1, n, P + n)


@torch.no_grad()
def forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    layers: Sequence[int] = (),
    logits_to_keep: int = 0,
) -> Features:
    """Run the target on `input_ids` (B, T) and capture logits, lm_head input and `layers`.
    `logits_to_keep=k > 0` computes logits for the last k positions only (a prefill needs one:
    the lm_head over every prompt position is V x H per token of pure waste); `last_hidden` and
    the layers always cover every position.

    For tree verification pass a 4D float mask from `tree_attention_mask`, `position_ids =
    prefix_len + depth` and a Cache; the cache grows by T entries (the caller compacts it).
    Runs under no_grad: the target is frozen. For training with gradients through the target
    (Medusa-2) use `capture` with `grad=True`.
    """
    from headstart.targets.attention import grouped_query_attention

    with grouped_query_attention(model):  # CPU: no KV copies for masked multi-token queries
        return capture(
            model,
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            layers=layers,
            logits_to_keep=logits_to_keep,
        )


def capture(
    model: nn.Module,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    layers: Sequence[int] = (),
    grad: bool = False,
    logits_to_keep: int = 0,
) -> Features:
    """Like `forward`, optionally with autograd enabled (`grad=True`)."""
    from headstart.targets.layer_kinds import layer_masks

    check_layer_ids(model, layers)
    attention_mask = layer_masks(model, attention_mask)  # per-kind masks for windowed layers
    blocks = decoder_layers(model)
    taken: dict[int, torch.Tensor] = {}
    handles = []

    def keep_output(layer_id: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            taken[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def keep_lm_input(_module: nn.Module, args: Any) -> None:
        taken[-1] = args[0]

    def keep_decoder_output(_module: nn.Module, _args: Any, output: Any) -> None:
        taken[-2] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    for layer_id in dict.fromkeys(int(i) for i in layers):
        handles.append(blocks[layer_id].register_forward_hook(keep_output(layer_id)))
    handles.append(model.get_output_embeddings().register_forward_pre_hook(keep_lm_input))
    if logits_to_keep:  # the lm_head then sees the last positions only; its input at every
        # position is the decoder's output (transformers slices that before the lm_head)
        handles.append(model.get_decoder().register_forward_hook(keep_decoder_output))
    try:
        with torch.set_grad_enabled(grad):
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{cache_keyword(type(model).forward): past_key_values},
                use_cache=past_key_values is not None,
                # passed only when asked: every causal LM in transformers accepts it, but 0 needs no support
                **({"logits_to_keep": logits_to_keep} if logits_to_keep else {}),
            )
    finally:
        for handle in handles:
            handle.remove()
    last_hidden = taken.pop(-1)
    if logits_to_keep:
        full = taken.pop(-2)
        if full.shape[1] != input_ids.shape[1] or not torch.equal(
            full[:, -last_hidden.shape[1] :], last_hidden
        ):
            raise HeadstartError(
                f"{type(model).__name__}: the decoder output is not the lm_head input",
                "call forward without logits_to_keep for this model",
            )
        last_hidden = full
    return Features(
        logits=out.logits, last_hidden=last_hidden, layers=taken, past_key_values=output_cache(out)
    )

"""Grouped-query attention over a masked (tree) query without copying the KV cache.

transformers' sdpa path repeats K and V to every query head (`repeat_kv`: a copy of the layer's
whole cache, per layer, per forward) whenever a mask is given and more than one token is queried,
because CUDA's fast kernels refuse GQA with a mask. A tree verify always has both. On a CPU,
torch's sdpa does the grouping inside the kernel (`enable_gqa`, torch >= 2.5) with the same
arithmetic: on SmolLM2 (9 query / 3 KV heads, 200-token context, 1 thread) a 2..8-node verify
got 6-10% cheaper, with bit-identical logits; the copies grow with the context.

One query token with a mask (a batched decode step: rows of different lengths need one) is the
same copy, and there it dominates: at 128 rows and 384 cached tokens SmolLM2's repeat_kv writes
and sdpa then reads 3x the cache every layer. There the query heads of a group are folded into
the query length instead, (B, Hq, 1, D) -> (B, Hkv, G, D): the G rows share the token, so they
share its mask row, and each KV head is read once (the same softmax per head).

`grouped_query_attention(model)` switches the target's attention to that function for the
duration of a forward, CPU only, and only for models whose attention is transformers' "sdpa".
Everything it does not handle (one query token, no mask, no grouping, position biases, softcap,
paged caches) goes to transformers' own sdpa function unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

NAME = "headstart_gqa_sdpa"


def gqa_sdpa(
    module: nn.Module,
    query: torch.Tensor,  # (B, Hq, T, D)
    key: torch.Tensor,  # (B, Hkv, S, D)
    value: torch.Tensor,  # (B, Hkv, S, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ((B, T, Hq, D), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain = all(kwargs.get(k) is None for k in ("position_bias", "softcap", "cache", "s_aux", "sinks"))
    if groups > 1 and plain and attention_mask is not None and query.shape[2] == 1:
        batch, heads, _, dim = query.shape
        folded = query.view(batch, heads // groups, groups, dim)  # (B, Hkv, G, D): no copy
        out = torch.nn.functional.scaled_dot_product_attention(
            folded, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
        )  # (B, Hkv, G, D); the mask (B, 1, 1, S) broadcasts over the G rows
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    if not (groups > 1 and plain and attention_mask is not None and query.shape[2] > 1):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, Hq, T, D)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> bool:
    """Register NAME with transformers once (attention and mask functions); False if too old."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # 2D masks are built as for sdpa
    return True


def _attention_configs(model: nn.Module) -> list[Any]:
    """The distinct config objects the target's attention modules read `_attn_implementation` from."""
    from headstart.targets.layer_kinds import decoder_layers

    configs: dict[int, Any] = {id(model.config): model.config}
    for layer in decoder_layers(model):
        config = getattr(getattr(layer, "self_attn", None), "config", None)
        if config is not None:
            configs[id(config)] = config
    return list(configs.values())


def usable(model: nn.Module) -> bool:
    """CPU sdpa targets on torch >= 2.5 (enable_gqa); CUDA keeps transformers' choice."""
    device = next(model.parameters()).device
    has_gqa = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)
    return device.type == "cpu" and has_gqa and getattr(model.config, "_attn_implementation", None) == "sdpa"


@contextlib.contextmanager
def grouped_query_attention(model: nn.Module) -> Iterator[None]:
    """Run the target's attention through `gqa_sdpa` inside the block (see the module doc)."""
    if not (usable(model) and _register()):
        yield
        return
    configs = [c for c in _attention_configs(model) if c._attn_implementation == "sdpa"]
    for config in configs:
        config._attn_implementation = NAME
    try:
        yield
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"

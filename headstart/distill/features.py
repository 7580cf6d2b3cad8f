"""Offline features: the target's hidden states for each finished record, for offline head training.

Layer names on disk: "layer<i>" for layer id i (the output of decoder layer i; see
headstart.targets.features for the convention) and "last" for `Features.last_hidden` (the lm_head
input). Each record's tensors are (T, H) in fp16/bf16, T = len(input_ids).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from headstart.errors import HeadstartError
from headstart.targets import Target, eagle3_layer_ids, forward

log = logging.getLogger(__name__)


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_feature_layers(spec: str, num_layers: int) -> list[str]:
    """'1,14,25' / 'eagle3' / 'last' / a comma mix -> ordered unique names ('layer1', ..., 'last')."""
    names: list[str] = []
    for part in (p.strip() for p in str(spec).split(",")):
        if not part:
            continue
        if part == "eagle3":
            names += [f"layer{i}" for i in eagle3_layer_ids(num_layers)]
        elif part == "last":
            names.append("last")
        elif part.lstrip("-").isdigit():
            layer = int(part)
            if not 0 <= layer < num_layers:
                raise HeadstartError(
                    f"--feature-layers: layer id {layer} out of range for a target with {num_layers} layers",
                    f"use ids 0..{num_layers - 1} (id i = output of decoder layer i), 'eagle3' or 'last'",
                )
            names.append(f"layer{layer}")
        else:
            raise HeadstartError(
                f"--feature-layers: cannot parse '{part}'", "use ids like 1,14,25, 'eagle3' or 'last'"
            )
    if not names:
        raise HeadstartError("--feature-layers is empty", "use e.g. --feature-layers eagle3")
    return list(dict.fromkeys(names))


def check_feature_budget(
    tokens: int, hidden_size: int, names: Sequence[str], dtype: str, cap_gb: float
) -> float:
    """Print the estimated feature-cache size (GB) for `tokens` positions; refuse over `cap_gb`."""
    size_gb = tokens * hidden_size * len(names) * torch.finfo(DTYPES[dtype]).bits / 8 / 1e9
    log.info(
        f"feature cache: layers {list(names)}, estimated {size_gb:.3f} GB for {tokens} positions (cap {cap_gb} GB)"
    )
    if size_gb > cap_gb:
        raise HeadstartError(
            f"the feature cache would take ~{size_gb:.2f} GB, over --max-feature-gb {cap_gb}",
            "raise --max-feature-gb, cache fewer layers, or lower --num",
        )
    return size_gb


def check_representable(stored: torch.Tensor, source: torch.Tensor, name: str, dtype: str) -> None:
    """Refuse features the storage dtype turned into inf (Gemma's residual stream exceeds
    float16's 65504): training on them gives a NaN loss from the first step."""
    if not torch.isfinite(stored).all() and torch.isfinite(source).all():
        peak = float(source.abs().max())
        raise HeadstartError(
            f"feature {name} reaches |x| = {peak:.4g}, beyond {dtype}'s range: it would be stored as inf",
            "use --feature-dtype bfloat16 (same size, float32's range) in a new --out",
        )


@torch.no_grad()
def compute_features(
    target: Target, sequences: Sequence[Sequence[int]], names: Sequence[str], dtype: str, chunk: int = 4
) -> list[dict[str, torch.Tensor]]:
    """One dict name -> (T_i, H) CPU tensor per sequence; `chunk` sequences per forward (right padded)."""
    ids_wanted = [int(n.removeprefix("layer")) for n in names if n != "last"]
    out: list[dict[str, torch.Tensor]] = []
    pad = target.tokenizer.pad_token_id or 0
    for start in range(0, len(sequences), chunk):
        group = sequences[start : start + chunk]
        width = max(len(s) for s in group)
        ids = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, seq in enumerate(group):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        # Right padding: real tokens sit at positions 0..len-1, so their states equal an unpadded run.
        feats = forward(
            target.model,
            ids.to(target.device),
            attention_mask=mask.to(target.device),
            layers=ids_wanted,
            logits_to_keep=1,  # the states are wanted, not the V x H lm_head at every position
        )
        for row, seq in enumerate(group):
            item = {}
            for name in names:
                state = feats.last_hidden if name == "last" else feats.layers[int(name.removeprefix("layer"))]
                item[name] = state[row, : len(seq)].to(
                    "cpu", DTYPES[dtype]
                )  # (T, H); cost: device->host copy
                check_representable(item[name], state[row, : len(seq)], name, dtype)
            out.append(item)
    return out

"""Build a fresh head for a target from a HeadSpec, and load any saved head by its kind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from headstart import kinds
from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig, HeadSpec
from headstart.targets.features import check_layer_ids, eagle3_layer_ids


def head_class(kind: str, layout: str = "fc") -> type:
    """The nn.Module class of a registered kind (headstart.kinds) in `layout`."""
    return kinds.get(kind).head_class(layout)


def head_config(spec: HeadSpec, target: Any) -> HeadConfig:
    """The checkpoint config for `spec` on `target`; checks the spec fits before any compute. The
    generic fields are set here, the kind's own ones by its class (`spec_fields`)."""
    kind = kinds.get(spec.kind)
    vocab = target.vocab_size
    layers: list[int] = []
    if kind.reads_layers:
        layers = (
            list(spec.feature_layers)
            if spec.feature_layers is not None
            else list(eagle3_layer_ids(target.num_layers))
        )
        check_layer_ids(target.model, layers)
    elif spec.feature_layers:
        raise HeadstartError(
            f"head.feature_layers is only used by kinds that read target layers, not {spec.kind}",
            "remove head.feature_layers",
        )
    if spec.draft_vocab_size > vocab:
        raise HeadstartError(
            f"head.draft_vocab_size={spec.draft_vocab_size} exceeds the target vocabulary ({vocab})",
            f"set head.draft_vocab_size <= {vocab} (0 = full vocabulary)",
        )
    fields = {"draft_vocab_size": spec.draft_vocab_size or vocab}
    fields.update(kind.head_class(spec.layout).spec_fields(spec, target))
    return HeadConfig.for_target(target, spec.kind, feature_layers=layers, **fields)


def draft_vocab(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent target ids (ties broken by lower id), sorted, (size,)."""
    # A stable sort on -counts keeps lower ids first among equals: deterministic across runs.
    order = torch.sort(-token_counts.to(torch.float64), stable=True).indices
    return order[:size].sort().values


def build_head(spec: HeadSpec, target: Any, token_counts: torch.Tensor | None = None, seed: int = 0) -> Any:
    """A new head for `target`, initialised from it and bound to it (on the target's device).

    token_counts (V,): how often each target token occurs in the training data; EAGLE-3 with a
    reduced draft vocabulary needs it.
    """
    config = head_config(spec, target)
    torch.manual_seed(seed)
    head = head_class(config.kind, config.layout)(config)
    if config.draft_vocab_size < config.vocab_size:
        if token_counts is None:
            raise HeadstartError(
                f"{spec.kind} with a reduced draft vocabulary needs token counts",
                "build it from training data",
            )
        head.set_draft_vocab(draft_vocab(token_counts, config.draft_vocab_size))
    head.to(device=target.device, dtype=target.dtype)
    head.init_from_target(target.model)
    if spec.init_layers == "target":
        left = head.init_layers_from_target(target.model)
        if left:
            logging.getLogger(__name__).info("init_layers=target: fresh values kept for %s", ", ".join(left))
    head.bind(target.model)
    return head


def load_heads(path: str | Path, target: Any = None) -> Any:
    """Load a head directory: headstart's own (any kind; with `target`, checked and bound) or a
    published one in the speculators, EAGLE-3 or Medusa format (needs `target`: it is checked
    against the target's shapes and bound to it). See headstart.heads.formats."""
    from headstart.heads.formats import detect_format, read_foreign

    fmt = detect_format(path)
    if fmt != "headstart":
        if target is None:
            raise HeadstartError(
                f"{path} holds a {fmt} head", "load it with its target: load_heads(path, target)"
            )
        return read_foreign(path, fmt, target)
    config = HeadConfig.read(path)
    return head_class(config.kind, config.layout).from_pretrained(path, target)


def load_heads_for_inference(path: str | Path, target: Any) -> Any:
    """`load_heads` for decoding: checked against and bound to `target`, in its dtype, eval, frozen."""
    heads = load_heads(path, target)
    heads.to(dtype=target.dtype).eval().requires_grad_(False)
    return heads

"""Build a fresh head for a target from a HeadSpec, and load any saved head by its kind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig, HeadSpec
from headstart.heads.dflash import derived_draft_config
from headstart.target.features import check_layer_ids, eagle3_layer_ids


def head_class(kind: str, layout: str = "fc") -> type:
    from headstart.heads.dflash import DFlashHead
    from headstart.heads.eagle import Eagle3FcHead, Eagle3Head, EagleHead
    from headstart.heads.medusa import MedusaHeads

    classes = {"medusa": MedusaHeads, "eagle": EagleHead, "eagle3": Eagle3FcHead, "dflash": DFlashHead}
    if kind not in classes:
        raise HeadstartError(f"unknown head kind '{kind}'", f"use one of {', '.join(classes)}")
    return Eagle3Head if (kind, layout) == ("eagle3", "reference") else classes[kind]


def head_config(spec: HeadSpec, target: Any) -> HeadConfig:
    """The checkpoint config for `spec` on `target`; checks the spec fits before any compute."""
    vocab = target.vocab_size
    layers: list[int] = []
    if spec.kind in ("eagle3", "dflash"):
        layers = (
            list(spec.feature_layers)
            if spec.feature_layers is not None
            else list(eagle3_layer_ids(target.num_layers))
        )
        check_layer_ids(target.model, layers)
    elif spec.feature_layers:
        raise HeadstartError(
            f"head.feature_layers is only used by eagle3 and dflash, not {spec.kind}",
            "remove head.feature_layers",
        )
    if spec.draft_vocab_size > vocab:
        raise HeadstartError(
            f"head.draft_vocab_size={spec.draft_vocab_size} exceeds the target vocabulary ({vocab})",
            f"set head.draft_vocab_size <= {vocab} (0 = full vocabulary)",
        )
    if spec.draft_vocab_size and spec.kind == "eagle":
        raise HeadstartError(
            "head.draft_vocab_size is not used by eagle (EAGLE-1 drafts through the target's lm_head)",
            "remove head.draft_vocab_size, or use head.kind=eagle3",
        )
    dflash = spec.kind == "dflash"
    eagle3 = spec.kind == "eagle3"
    layers_of_own = spec.num_layers if spec.kind in ("medusa", "dflash") or eagle3 else 1
    # a draft layer of another architecture than the target's (DFlash always: Qwen3)
    other_layer = dflash or (eagle3 and spec.draft_layer == "qwen3")
    return HeadConfig(
        kind=spec.kind,
        hidden_size=target.hidden_size,
        vocab_size=vocab,
        target=dict(target.fingerprint),
        target_config=target.model.config.to_dict(),
        num_heads=spec.num_heads if spec.kind == "medusa" else 1,
        num_layers=layers_of_own,  # type: ignore[arg-type]
        block_size=spec.block_size if dflash else 0,
        mask_token_id=mask_token(spec, target) if dflash else -1,
        draft_config=derived_draft_config(
            target.model.config.to_dict(), target.hidden_size, vocab, spec.num_layers
        )
        if other_layer
        else {},  # type: ignore[arg-type]  # fmt: skip
        fc_norm=eagle3 and spec.fc_norm,
        shared_lm_head=spec.shared_lm_head if spec.kind == "medusa" else True,
        feature_layers=layers,
        draft_vocab_size=(spec.draft_vocab_size or vocab) if spec.kind != "eagle" else vocab,
        layout=spec.layout if spec.kind == "eagle3" else "fc",
        # the reference layout has its norms built in
        input_norms=spec.input_norms
        and (spec.kind == "eagle" or (spec.kind, spec.layout) == ("eagle3", "fc")),
    )


def mask_token(spec: HeadSpec, target: Any) -> int:
    """DFlash's mask token: head.mask_token_id, else the tokenizer's mask, pad or end token. Any
    fixed id works (the draft learns what its frozen embedding means in a block); every runtime
    reads the id from the checkpoint."""
    vocab = target.vocab_size
    if spec.mask_token_id is not None:
        if not 0 <= spec.mask_token_id < vocab:
            raise HeadstartError(
                f"head.mask_token_id={spec.mask_token_id} is not a token of the target (0..{vocab - 1})",
                "pick an id in the vocabulary, or leave head.mask_token_id unset",
            )
        return spec.mask_token_id
    tokenizer = getattr(target, "tokenizer", None)
    for name in ("mask_token_id", "pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and 0 <= value < vocab:
            return value
    return vocab - 1


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

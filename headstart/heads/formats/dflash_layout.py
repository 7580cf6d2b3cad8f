"""What the two DFlash formats (speculators' `dflash`, z-lab's `DFlashDraftModel`) share: the
draft layers' transformers config as engines read it, the check that a head is a DFlash head,
and the import of either into a headstart DFlashHead. Weight names are the same in both and in
headstart (`fc`, `hidden_norm`, `layers.N.*`, `norm`): no renaming. Layer ids: z-lab's
`target_layer_ids` are headstart's (the OUTPUT of decoder layer i); speculators' aux ids, like
EAGLE-3's, are one more (the INPUT of layer i + 1)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig

log = logging.getLogger(__name__)

CONFIG_JUNK = ("architectures", "transformers_version", "_name_or_path", "auto_map", "_commit_hash", "dtype",
               "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id")  # fmt: skip


def check_exportable(head: Any, fmt: str, draft_vocab: bool = False) -> HeadConfig:
    """The head's config, if it is a DFlash head. `draft_vocab`: the format holds a draft
    vocabulary (speculators' d2t/t2d and reduced lm_head); else a reduced one is exported whole."""
    config: HeadConfig = head.config
    if config.kind != "dflash":
        raise HeadstartError(
            f"the {fmt} format holds DFlash block drafters, not {config.kind} heads",
            "export EAGLE-3 heads with --format speculators or eagle, Medusa heads with --format medusa",
        )
    if not draft_vocab and config.draft_vocab_size and config.draft_vocab_size < config.vocab_size:
        # cost of the full-vocabulary layout: tokens outside the draft vocabulary were never
        # trained down, and the engines' argmax over every lm_head row may pick them
        log.warning(
            "warning: this DFlash head drafts over %d of %d tokens in headstart; the %s export drafts over "
            "all of them, so an engine may draft (and accept) somewhat less than headstart does "
            "(--format speculators keeps the draft vocabulary)",
            config.draft_vocab_size, config.vocab_size, fmt,
        )  # fmt: skip
    return config


def layer_config(head: Any) -> dict[str, Any]:
    """The draft layers' transformers config (qwen3, full attention), every field written out."""
    data = head.layer_config.to_dict()
    for key in CONFIG_JUNK:
        data.pop(key, None)
    data["model_type"] = "qwen3"
    return data


def state(head: Any, draft_vocab: bool = False) -> dict[str, torch.Tensor]:
    """The weights a DFlash runtime reads. Full vocabulary: the draft layers alone (the engine
    uses the target's lm_head). `draft_vocab` and a head with one: also speculators' maps and
    `lm_head.weight`, the target lm_head's rows of the draft vocabulary (Vd, H), which is what
    headstart drafts through (the engine then ranks those Vd tokens only, as headstart does)."""
    weights = {k: v for k, v in head.state_dict().items() if k not in ("d2t", "t2d")}
    if draft_vocab and head.has_draft_vocab:
        lm_head = head.bound("lm_head").weight
        weights |= {
            "d2t": head.d2t,
            "t2d": head.t2d,
            "lm_head.weight": lm_head[head.draft_ids().to(lm_head.device)],
        }
    return weights


def draft_vocab_of(directory: Path, weights: dict[str, torch.Tensor], target: Any) -> int:
    """The draft vocabulary size of a checkpoint's own lm_head (its d2t/t2d maps and reduced
    rows), which headstart takes only as rows of the target's lm_head: the full size without one."""
    if "d2t" not in weights and "lm_head.weight" not in weights:
        return target.vocab_size
    rows = weights.get("lm_head.weight")
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    reduced = rows is not None and rows.dim() == 2 and rows.shape[0] < target.vocab_size
    maps = d2t is not None and t2d is not None
    if rows is None or reduced != maps or (maps and tuple(d2t.shape) != (rows.shape[0],)):
        raise HeadstartError(
            f"{directory} has an incomplete draft vocabulary (needs lm_head.weight with d2t and t2d of its "
            "rows, or a full-vocabulary lm_head alone)",
            "restore or re-download the checkpoint",
        )
    weight = target.model.get_output_embeddings().weight.detach()
    ids = torch.arange(rows.shape[0]) + (d2t.long() if maps else 0)
    fits = rows.shape[1] == weight.shape[1] and bool((ids >= 0).all() and (ids < weight.shape[0]).all())
    if maps and fits:
        fits = tuple(t2d.shape) == (weight.shape[0],) and torch.equal(
            t2d.bool().nonzero()[:, 0], ids.sort().values
        )
    if not fits or not _same_rows(weight[ids.to(weight.device)], rows.to(weight.device)):
        raise HeadstartError(
            f"{directory} has an lm_head of its own, not rows of this target's: headstart drafts DFlash "
            "blocks through the target's lm_head",
            "use a DFlash head whose lm_head is the target's (or its draft-vocabulary rows)",
        )
    return int(rows.shape[0])


def _same_rows(own: torch.Tensor, saved: torch.Tensor) -> bool:
    """The target's rows and a checkpoint's copy of them, each rounded to its own dtype (an export
    in bf16, a target loaded in float16): equal within the coarser dtype's rounding."""
    eps = max(torch.finfo(own.dtype).eps, torch.finfo(saved.dtype).eps)
    return torch.allclose(own.float(), saved.float(), rtol=eps, atol=eps * 1e-3)


def load_dflash(directory: Path, fmt: str, layer: dict[str, Any], block_size: int, mask_token_id: int,
                feature_layers: list[int], target: Any) -> Any:  # fmt: skip
    """A published DFlash head (its draft `layer` config and weights) as a DFlashHead for
    `target`, every shape checked."""
    from headstart.heads.dflash import DRAFT_ARCH, DFlashHead
    from headstart.heads.files import load_checked, read_weights
    from headstart.heads.formats.common import mismatch

    layer = {k: v for k, v in layer.items() if k not in CONFIG_JUNK}
    if "sliding_attention" in (layer.get("layer_types") or []) or layer.get("use_sliding_window"):
        # speculators makes such layers causal inside the block and windows the context (z-lab's
        # newer drafts mix them); headstart's draft layers attend to the whole block and context
        raise HeadstartError(
            f"{directory} has sliding-window draft layers, which headstart's DFlash drafter does not run",
            "use a DFlash head whose draft layers are all full attention",
        )
    if layer.get("model_type", DRAFT_ARCH) != DRAFT_ARCH:
        raise HeadstartError(
            f"{directory} has {layer.get('model_type')} draft layers: headstart runs {DRAFT_ARCH} DFlash layers",
            "use a DFlash head with qwen3 draft layers (speculators', z-lab's and llama.cpp's)",
        )
    mismatch(directory, "hidden size", int(layer.get("hidden_size", 0)), target.hidden_size)
    mismatch(directory, "vocabulary", int(layer.get("vocab_size", 0)), target.vocab_size)
    count = target.num_layers
    if not feature_layers or any(not 0 <= i < count for i in feature_layers):
        raise HeadstartError(
            f"{directory} reads target layers {feature_layers} (output ids), this target has {count} layers",
            "load the target the head was trained for",
        )
    if not (2 <= block_size <= 64 and 0 <= mask_token_id < target.vocab_size):
        raise HeadstartError(
            f"{directory}: block size {block_size} or mask token {mask_token_id} is out of range",
            "restore or re-download the checkpoint",
        )
    weights = {k: v for k, v in read_weights(directory).items() if not k.startswith("verifier_")}
    draft_vocab = draft_vocab_of(directory, weights, target)
    weights.pop("lm_head.weight", None)  # the target's rows (checked): drafted through the target's own
    if draft_vocab == target.vocab_size:
        weights.pop("d2t", None), weights.pop("t2d", None)
    layers = int(layer.get("num_hidden_layers", 0))
    config = HeadConfig.for_target(
        target,
        "dflash",
        num_layers=layers,
        feature_layers=list(feature_layers),
        block_size=block_size,
        mask_token_id=mask_token_id,
        draft_vocab_size=draft_vocab,
        draft_config=layer | {"model_type": DRAFT_ARCH},
        training={"imported_from": f"{directory} ({fmt})"},
    )
    head = DFlashHead(config)
    load_checked(head, weights, directory)
    return head

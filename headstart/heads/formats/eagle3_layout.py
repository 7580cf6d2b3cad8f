"""What the two EAGLE-3 formats (speculators, the EAGLE release) share: the reference layer's
weights under a format's prefix, the norm-order flags every reader could default differently,
the draft layer's transformers config, and the import of either into a headstart Eagle3Head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig

LAYER = "midlayer.layer."  # headstart's prefix of the reference layer's weights
# Flags every EAGLE-3 reader could default differently; headstart's reference layout is all False
# but fc_norm (EAGLE-3.1's norm on each tapped state, HeadSpec.fc_norm), which a head may set.
EAGLE3_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
SETTABLE = ("fc_norm",)


def flags(config: HeadConfig) -> dict[str, bool]:
    """Every flag of EAGLE3_FLAGS, written explicitly (readers disagree on defaults)."""
    return {name: bool(getattr(config, name, False)) if name in SETTABLE else False for name in EAGLE3_FLAGS}


CONFIG_JUNK = ("architectures", "transformers_version", "_name_or_path", "auto_map", "_commit_hash", "dtype")


def check_exportable(
    head: Any, fmt: str, layer_types: tuple[str, ...], fc_norm: bool = False
) -> dict[str, Any]:
    """The draft layer's config when `head` is an EAGLE-3 head in the reference layout whose
    layer the format's readers build (and, unless `fc_norm`, without per-tap norms); one line
    otherwise."""
    config: HeadConfig = head.config
    if config.kind != "eagle3" or config.layout != "reference":
        what = (
            f"an {config.kind} head"
            if config.kind != "eagle3"
            else "an EAGLE-3 head in headstart's fc layout"
        )
        raise HeadstartError(
            f"the {fmt} format holds EAGLE-3 heads in the reference layout, not {what}",
            "retrain with head.kind=eagle3 (head.layout=reference is the default), or use --format medusa for Medusa",
        )
    if config.num_layers > 1:
        raise HeadstartError(
            f"the {fmt} format holds 1-layer EAGLE-3 heads; this head has {config.num_layers} draft layers",
            "keep the head in headstart's format (headstart runs it), or train with head.num_layers=1",
        )
    if config.fc_norm and not fc_norm:
        raise HeadstartError(
            f"the {fmt} format has no norms on the tapped states before fc (this head's head.fc_norm)",
            "export with --format speculators (its fc_norm flag), or train with head.fc_norm=false",
        )
    layer = layer_config(config)
    if layer["model_type"] not in layer_types:
        raise HeadstartError(
            f"{fmt} readers build {'/'.join(layer_types)} draft layers, this head's is {layer['model_type']}",
            "export with --format speculators (llama, qwen3) or serve the head with headstart",
        )
    return layer


def renamed_state(head: Any, prefix: str) -> dict[str, torch.Tensor]:
    """The head's weights with the reference layer under `prefix` (`layers.0.`, `midlayer.`)."""
    state = dict(head.state_dict())
    return {(prefix + k[len(LAYER) :] if k.startswith(LAYER) else k): v for k, v in state.items()}


def aux_ids(config: HeadConfig) -> list[int]:
    """The engines' aux-layer ids: id i = the input of decoder layer i = headstart's id + 1."""
    return [i + 1 for i in config.feature_layers]


def layer_config(config: HeadConfig) -> dict[str, Any]:
    """The draft layer's transformers config as the engines read it: one layer, the target's vocabulary."""
    from headstart.heads.layer import one_layer_config

    data = one_layer_config(config.draft_config or config.target_config).to_dict()
    for key in CONFIG_JUNK:
        data.pop(key, None)
    data.update(num_hidden_layers=1, vocab_size=config.vocab_size)
    data.pop("layer_types", None)
    return data


def load_eagle3(directory: Path, fmt: str, config: dict[str, Any], layer: dict[str, Any], prefix: str,
                target: Any) -> Any:  # fmt: skip
    """A published EAGLE-3 head (its `layer` config and weights under `prefix`) as an Eagle3Head
    for `target`, every shape checked."""
    from headstart.heads.eagle import Eagle3Head
    from headstart.heads.files import load_checked, read_weights
    from headstart.heads.formats.common import mismatch

    found = {k: bool(config.get(k, False)) for k in EAGLE3_FLAGS}
    unsupported = [k for k, v in found.items() if v and k not in SETTABLE]
    if unsupported:
        raise HeadstartError(
            f"{directory} sets {', '.join(unsupported)}: headstart runs the reference EAGLE-3 order only",
            "use a head trained without these options",
        )
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise HeadstartError(
            f"{directory} has {layer['num_hidden_layers']} draft layers",
            "headstart runs 1-layer EAGLE-3 heads",
        )
    hidden = int(layer.get("hidden_size", 0))
    mismatch(directory, "hidden size", int(config.get("target_hidden_size") or hidden), target.hidden_size)
    mismatch(directory, "draft hidden size", hidden, target.hidden_size)
    mismatch(directory, "vocabulary", int(layer.get("vocab_size", 0)), target.vocab_size)
    aux = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    count = target.num_layers
    aux = list(aux) if aux else [2, count // 2, count - 3]
    if any(not 1 <= int(i) <= count for i in aux):
        raise HeadstartError(
            f"{directory} taps target layers {aux}, this target has {count} layers",
            "load the target the head was trained for",
        )
    state = read_weights(directory)
    state = {(LAYER + k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith("verifier_")}
    layer.setdefault("model_type", "llama")
    draft = int(config.get("draft_vocab_size") or target.vocab_size)
    head_config = HeadConfig.for_target(  # the draft layer's own config and width, as published
        target,
        "eagle3",
        layout="reference",
        hidden_size=hidden,
        target_config={k: v for k, v in layer.items() if k not in ("draft_vocab_size", "eagle_config")},
        feature_layers=[int(i) - 1 for i in aux],
        draft_vocab_size=draft,
        own_embeddings="embed_tokens.weight" in state,
        fc_norm=found["fc_norm"],
        training={"imported_from": f"{directory} ({fmt})"},
    )
    head = Eagle3Head(head_config)
    if "d2t" not in state:  # full vocabulary: identity maps
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    state["d2t"], state["t2d"] = state["d2t"].to(torch.long), state["t2d"].to(torch.bool)
    load_checked(head, state, directory)
    return head

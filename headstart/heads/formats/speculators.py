"""vLLM's `speculators` format: config.json with `speculators_model_type`, `architectures`,
`transformer_layer_config` (the draft layers' transformers config), the aux-layer ids and a
`speculators_config` naming the verifier. `vllm serve DIR` takes the directory as it is. Model
types: eagle3 (weights as the reference release's with `midlayer.` -> `layers.0.`) and dflash
(`fc`, `hidden_norm`, `layers.N.*`, `norm`; the block size, mask token and aux-layer ids in the
config; full attention, so the block is bidirectional; a draft vocabulary as `lm_head.weight`,
the target lm_head's rows, with `d2t`/`t2d`, as speculators saves one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.heads.config import HeadConfig
from headstart.heads.formats import dflash_layout as dflash
from headstart.heads.formats import eagle3_layout as eagle3

FILES = frozenset({"config.json", "model.safetensors"})
PREFIX = "layers.0."
LAYER_TYPES = ("llama", "qwen3")  # speculators' model_definitions.model_classes
MODEL_TYPES = ("eagle3", "dflash")


def detects(config: dict[str, Any]) -> bool:
    return config.get("speculators_model_type") in MODEL_TYPES


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats.common import writer

    if head.config.kind == "dflash":
        return writer(*dflash_export(head, verifier), dtype)
    layer = eagle3.check_exportable(head, "speculators", LAYER_TYPES, fc_norm=True)
    config: HeadConfig = head.config
    state = eagle3.renamed_state(head, PREFIX)
    if (
        config.draft_vocab_size == config.vocab_size
    ):  # speculators registers no maps without a draft vocabulary
        state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    speculators = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": eagle3.aux_ids(config),
        "embed_requires_grad": False,
        **eagle3.flags(config),
        "speculators_config": speculators_config(config, "eagle3", 3, verifier),
    }
    return writer(speculators, state, dtype)


def speculators_config(config: HeadConfig, algorithm: str, tokens: int, verifier: str) -> dict[str, Any]:
    """The `speculators_config` block: algorithm, the greedy proposal method, the verifier."""
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "verifier": {"name_or_path": verifier, "architectures": [str(config.target.get("architecture"))]},
    }


def dflash_export(head: Any, verifier: str) -> tuple[dict[str, Any], dict[str, Any]]:
    config = dflash.check_exportable(head, "speculators", draft_vocab=True)
    layer = dflash.layer_config(head)
    vocab = config.draft_vocab_size or config.vocab_size
    speculators = {
        "architectures": ["DFlashDraftModel"],  # what speculators' own save_pretrained writes
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": vocab,  # reduced: lm_head (the target's rows), d2t and t2d written too
        "target_hidden_size": config.hidden_size,
        "aux_hidden_state_layer_ids": eagle3.aux_ids(config),
        "block_size": config.block_size,
        "mask_token_id": config.mask_token_id,
        "sample_from_anchor": False,  # slot 0 is the anchor; slots 1.. are drafted
        "sliding_window_non_causal": False,  # no sliding layers: every layer is full attention
        "tie_word_embeddings": False,
        "speculators_config": speculators_config(config, "dflash", config.block_size - 1, verifier),
    }
    return speculators, dflash.state(head, draft_vocab=True)


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    layer = dict(config["transformer_layer_config"])
    if config.get("speculators_model_type") == "dflash":
        if config.get("sample_from_anchor"):
            raise HeadstartError(
                f"{directory} samples from its anchor slot (DSpark-style): headstart runs DFlash blocks",
                "use a dflash head with sample_from_anchor false",
            )
        aux = [int(i) - 1 for i in config.get("aux_hidden_state_layer_ids") or []]
        return dflash.load_dflash(directory, "speculators", layer, int(config.get("block_size") or 8),
                                  int(config.get("mask_token_id", -1)), aux, target)  # fmt: skip
    return eagle3.load_eagle3(directory, "speculators", config, layer, PREFIX, target)

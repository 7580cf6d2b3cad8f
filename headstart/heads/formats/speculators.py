"""vLLM's `speculators` format: config.json with `speculators_model_type`, `architectures`,
`transformer_layer_config` (the draft layers' transformers config), the aux-layer ids and a
`speculators_config` naming the verifier; weights as the reference release's with `midlayer.` ->
`layers.0.`. `vllm serve DIR` takes the directory as it is. Model types: eagle3."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headstart.heads.config import HeadConfig
from headstart.heads.formats import eagle3

FILES = frozenset({"config.json", "model.safetensors"})
PREFIX = "layers.0."
LAYER_TYPES = ("llama", "qwen3")  # speculators' model_definitions.model_classes
MODEL_TYPES = ("eagle3",)


def detects(config: dict[str, Any]) -> bool:
    return config.get("speculators_model_type") in MODEL_TYPES


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats import writer

    layer = eagle3.check_exportable(head, "speculators", LAYER_TYPES)
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
        **eagle3.EAGLE3_FLAGS,
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


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    layer = dict(config["transformer_layer_config"])
    return eagle3.load_eagle3(directory, "speculators", config, layer, PREFIX, target)

"""The EAGLE-3 release's layout: a LlamaForCausalLMEagle3 config.json (`draft_vocab_size`,
`eagle_config.eagle_aux_hidden_state_layer_ids`) and weights `midlayer.*`, `fc`, `norm`,
`lm_head`, `d2t`, `t2d`; read by SGLang, SpecForge, the EAGLE repo and llama.cpp's converter.
On import, the release's own `pytorch_model.bin` too (read with weights_only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headstart.heads.formats import eagle3_layout as eagle3

FILES = frozenset({"config.json", "model.safetensors"})
PREFIX = "midlayer."
LAYER_TYPES = ("llama",)  # the draft layers its readers build


def detects(config: dict[str, Any]) -> bool:
    if "speculators_model_type" in config:  # speculators' peagle, dflash2 and eagle have a draft vocab too
        return False
    return "draft_vocab_size" in config or any("Eagle3" in str(a) for a in config.get("architectures") or [])


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats.common import writer

    layer = eagle3.check_exportable(head, "eagle", LAYER_TYPES)
    config = head.config
    eagle = {
        **layer,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "tie_word_embeddings": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": eagle3.aux_ids(config),
            "use_aux_hidden_state": True,
        },
        **eagle3.flags(config),
    }
    return writer(eagle, eagle3.renamed_state(head, PREFIX), dtype)


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    return eagle3.load_eagle3(directory, "eagle", config, dict(config), PREFIX, target)

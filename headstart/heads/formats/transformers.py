"""A trained draft model as a plain transformers model directory (config.json of the target's
architecture, model.safetensors, the target's tokenizer files): what `--draft-model DIR` loads in
headstart, and what any engine that takes a draft model reads (vLLM's and SGLang's draft-model
speculation, llama.cpp's `--model-draft` after its GGUF converter, transformers' assisted
generation). Only a head that is a whole causal LM (the `draft_model` kind) can be written so.

Not read back as heads: such a directory drafts as a draft model (`--draft-model DIR`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError

FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "README.md", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json"})  # fmt: skip
WITH_TOKENIZER = True
"""export_heads saves the target's tokenizer beside it: a model directory without one loads nowhere."""


def detects(config: dict[str, Any]) -> bool:
    """A plain causal LM's config (asked last: every heads format's config is caught before)."""
    architectures = config.get("architectures") or []
    return (
        "model_type" in config
        and "format" not in config
        and "speculators_model_type" not in config
        and any(str(a).endswith("ForCausalLM") for a in architectures)
    )


def export(head: Any, verifier: str, dtype: str) -> Callable[[Path], None]:
    from headstart.heads.formats.common import torch_dtype

    model = getattr(head, "model", None)
    if model is None or not hasattr(model, "save_pretrained") or not hasattr(model, "generate"):
        raise HeadstartError(
            f"the transformers format holds a draft model (a whole causal LM), not {head.config.kind} heads",
            "export draft_model heads this way, or use another --format",
        )
    dtype_ = torch_dtype(dtype)

    def write(directory: Path) -> None:
        import copy

        cast = copy.deepcopy(model).to(dtype_)  # the head itself stays as it is (fp32 for training)
        cast.save_pretrained(directory, safe_serialization=True)

    return write


def load(directory: Path, config: dict[str, Any], target: Any) -> Any:
    raise HeadstartError(
        f"{directory} is a plain transformers model, not heads",
        f"draft with it: --draft-model {directory}",
    )

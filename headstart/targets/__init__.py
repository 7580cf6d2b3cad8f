"""The target layer: the only code that owns the frozen target model.

`load_target(spec)` loads a Hub id, a local directory, a `.gguf` file or the embedded `smollm2`;
`forward`/`capture` run it with optional 4D tree masks, position ids and a KV cache, returning
logits, the lm_head input and chosen layers (see `features` for the layer-id convention).
"""

from headstart.targets.chat import Chat
from headstart.targets.features import (
    Features,
    capture,
    check_layer_ids,
    decoder_layers,
    eagle3_layer_ids,
    forward,
    new_cache,
    tree_attention_mask,
)
from headstart.targets.gguf import EMBEDDED_NAME, EMBEDDED_PIP, cache_root, embedded_gguf_path
from headstart.targets.load import (
    Target,
    describe,
    eos_token_ids,
    fingerprint_mismatch,
    load_target,
    resolve_spec,
)

__all__ = [
    "EMBEDDED_NAME",
    "EMBEDDED_PIP",
    "Chat",
    "Features",
    "Target",
    "cache_root",
    "capture",
    "check_layer_ids",
    "decoder_layers",
    "describe",
    "eagle3_layer_ids",
    "embedded_gguf_path",
    "eos_token_ids",
    "fingerprint_mismatch",
    "forward",
    "load_target",
    "new_cache",
    "resolve_spec",
    "tree_attention_mask",
]

"""The contract between draft heads, training and the decoder.

Shapes: B batch, T positions, H the target's hidden size, V the target vocabulary, Vd a head's
draft vocabulary (Vd == V except EAGLE-3 with a reduced vocabulary).

Alignment (the EAGLE convention, also used for Medusa):
    the target reads tokens x_0..x_{n-1} and emits features f_0..f_{n-1} (f_t predicts x_{t+1}).
    * Medusa head k (k = 1..K) reads f_t and predicts x_{t+1+k}  (the target's own lm_head gives x_{t+1}).
    * An EAGLE-style head at position t reads its input hidden h_t and the NEXT token x_{t+1} and
      outputs g_t, its guess of the target's feature at t+1; `logits(g_t)` predicts x_{t+2}.
      At the first draft step h_t = `fuse(target features)_t`; on later steps h_t is the head's own
      previous output g (this is how EAGLE drafts autoregressively and how EAGLE-3's training-time
      test unrolls).

Heads never load or own the target: `bind(target_model)` attaches frozen references to the
target's token embeddings and (where used) its lm_head; bound modules are not saved.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class DraftHead(Protocol):
    kind: str
    """A registered kind (headstart.kinds)."""
    feature_layers: tuple[int, ...]
    """Target layer ids (see headstart.targets.features for the convention) this head reads;
    empty when it only needs `Features.last_hidden` (Medusa, EAGLE-1)."""

    def bind(self, target_model: Any) -> None:
        """Attach frozen references to the target's embeddings / lm_head (not saved)."""


class MedusaLike(DraftHead, Protocol):
    num_heads: int

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, H) = Features.last_hidden -> logits (K, B, T, V); head k-1 predicts x_{t+1+k}."""


class EagleLike(DraftHead, Protocol):
    draft_vocab_size: int

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target features -> the head's first-step input hidden (B, T, H).
        EAGLE-1: `last_hidden` unchanged. EAGLE-3: fc(cat(layers[i] for i in feature_layers))."""

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """hidden (B, T, H) and next tokens input_ids (B, T) -> g (B, T, H), the guessed next features.
        attention_mask: None (causal over the cache + new tokens) or a 4D additive float mask
        (B, 1, T, cached + T) as built by headstart.targets.tree_attention_mask.
        past_key_values: the head's own KV cache (`new_cache()`), grown by T entries."""

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """g (B, T, H) -> draft logits (B, T, Vd)."""

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity unless EAGLE-3 uses d2t)."""

    def new_cache(self) -> Any:
        """An empty KV cache for the head's decoder layer."""

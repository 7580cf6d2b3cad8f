"""EAGLE-1/2 and EAGLE-3 heads: one decoder layer of the target's architecture that guesses the
target's next feature from (next token, current feature); see headstart.heads.base for alignment.

EAGLE-3 here feeds the decoder layer through fc(cat(embed, h)) (2H -> H) and a standard layer,
not the vLLM/SGLang `LlamaForCausalLMEagle3` layout (q/k/v over 2H): our checkpoints are not
loadable by vLLM as EAGLE-3 drafts. The standard layer keeps the head free of modeling code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import HeadConfig
from headstart.heads.layer import DraftLayer
from headstart.heads.vocab import DraftVocab


class EagleHead(HeadCheckpoint, nn.Module):
    """EAGLE-1/2: g_t = layer(fc([norm(embed(x_{t+1})); norm(h_t)])); the target's lm_head maps g
    to tokens (no norms in checkpoints saved before `input_norms`)."""

    kind = "eagle"

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.feature_layers: tuple[int, ...] = tuple(config.feature_layers)
        self.draft_vocab_size = config.draft_vocab_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.midlayer = DraftLayer(config.target_config)
        # Separate norms, so neither input swamps the other in fc (see HeadSpec.input_norms).
        self.embed_norm = self.midlayer.new_norm() if config.input_norms else None
        self.hidden_norm = self.midlayer.new_norm() if config.input_norms else None
        self._bound: dict[str, nn.Module] = {}

    def bind(self, target_model: Any) -> None:
        """Frozen references to the target's token embeddings and lm_head (not saved)."""
        self._bound["embed"] = target_model.get_input_embeddings()
        self._bound["lm_head"] = target_model.get_output_embeddings()

    def init_from_target(self, target_model: Any) -> None:
        """Nothing to copy for EAGLE-1: its vocabulary projection is the target's."""

    def bound(self, name: str) -> nn.Module:
        if name not in self._bound:
            raise HeadstartError(
                f"{self.kind} head is not bound to a target (no {name})", "call head.bind(target.model)"
            )
        return self._bound[name]

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        return last_hidden

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """hidden (B, T, H), next tokens (B, T) -> g (B, T, H); see DraftHead in base.py."""
        embeds = self.bound("embed")(input_ids).to(hidden.dtype)  # (B, T, H), frozen
        if self.embed_norm is not None and self.hidden_norm is not None:
            embeds, hidden = self.embed_norm(embeds), self.hidden_norm(hidden)
        x = self.fc(torch.cat([embeds, hidden], dim=-1))  # (B, T, H)
        return self.midlayer(
            x, position_ids=position_ids, attention_mask=attention_mask, past_key_values=past_key_values
        )

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.bound("lm_head")(g)  # (B, T, V)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def new_cache(self) -> Any:
        return self.midlayer.new_cache()


class Eagle3Head(DraftVocab, EagleHead):
    """EAGLE-3: fuses three target layers (3H -> H), then its own norm and lm_head over a draft
    vocabulary of Vd tokens, with d2t (target_id = i + d2t[i]) and t2d (bool, V) maps."""

    kind = "eagle3"

    def __init__(self, config: HeadConfig) -> None:
        super().__init__(config)
        hidden, draft = config.hidden_size, config.draft_vocab_size
        self.fuse_fc = nn.Linear(len(config.feature_layers) * hidden, hidden, bias=False)
        self.norm = self.midlayer.new_norm()
        self.lm_head = nn.Linear(hidden, draft, bias=False)
        # Identity maps until `set_draft_vocab`; saved with the weights (vLLM's convention).
        self.init_draft_vocab(draft, config.vocab_size)

    def init_from_target(self, target_model: Any) -> None:
        """Start from the target's final norm and the draft-vocabulary rows of its lm_head."""
        with torch.no_grad():
            weight = target_model.get_output_embeddings().weight
            self.lm_head.weight.copy_(weight[self.draft_ids().to(weight.device)])
            norm = getattr(target_model.get_decoder(), "norm", None)
            if norm is not None and type(norm) is type(self.norm):
                self.norm.load_state_dict(norm.state_dict())

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        missing = [i for i in self.feature_layers if i not in layers]
        if missing:
            raise HeadstartError(
                f"eagle3 head needs target layers {missing}", f"capture layers {list(self.feature_layers)}"
            )
        return self.fuse_fc(torch.cat([layers[i] for i in self.feature_layers], dim=-1))  # (B, T, H)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(g))  # (B, T, Vd)

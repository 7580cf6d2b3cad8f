"""Small randomly initialised heads that satisfy headstart.heads.base (MedusaLike / EagleLike).

Exactness must hold whatever the draft proposes, so random heads are perfect for exactness tests;
`ScriptedMedusa` additionally drafts a known continuation to force long accepted paths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class RandomMedusa(nn.Module):
    kind = "medusa"
    feature_layers: tuple[int, ...] = ()

    def __init__(self, hidden: int, vocab: int, num_heads: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.num_heads = num_heads
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_heads))
        self.out = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(num_heads))
        for head in self.out:
            head.weight.data.mul_(8.0)  # peaked drafts, like the tiny target's

    def bind(self, target_model: Any) -> None:
        pass

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        pairs = list(zip(self.blocks, self.out, strict=True))[:count]
        return torch.stack([o(hidden + torch.nn.functional.silu(b(hidden))) for b, o in pairs])


class RandomEagle(nn.Module):
    """EAGLE-1 style (kind 'eagle') or, with `draft_vocab`, EAGLE-3 style (fused layers, d2t)."""

    def __init__(
        self, target_model: Any, seed: int = 0, draft_vocab: int | None = None, layers: tuple[int, ...] = ()
    ) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        torch.manual_seed(seed)
        cfg = target_model.config
        hidden, vocab = cfg.hidden_size, cfg.vocab_size
        self.config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=1,
            vocab_size=vocab,
        )
        self.config._attn_implementation = "sdpa"
        self.kind = "eagle3" if draft_vocab else "eagle"
        self.feature_layers = tuple(layers)
        self.draft_vocab_size = draft_vocab or vocab
        self.fc = nn.Linear(2 * hidden, hidden)
        self.fuse_fc = nn.Linear(len(layers) * hidden, hidden) if layers else None
        self.layer = LlamaDecoderLayer(self.config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(config=self.config)
        self.lm_head = nn.Linear(hidden, self.draft_vocab_size, bias=False) if draft_vocab else None
        if draft_vocab:
            self.lm_head.weight.data.mul_(8.0)
            ids = torch.randperm(vocab)[:draft_vocab].sort().values
            self.register_buffer("d2t", ids - torch.arange(draft_vocab))
        self._bound: dict[str, Any] = {}

    def bind(self, target_model: Any) -> None:
        self._bound = {
            "embed": target_model.get_input_embeddings(),
            "lm_head": target_model.get_output_embeddings(),
        }

    def fuse(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor]) -> torch.Tensor:
        if self.fuse_fc is None:
            return last_hidden
        return self.fuse_fc(torch.cat([layers[i] for i in self.feature_layers], dim=-1))

    def forward(self, hidden, input_ids, *, position_ids, attention_mask=None, past_key_values=None):
        x = self.fc(torch.cat([self._bound["embed"](input_ids), hidden], dim=-1))
        out = self.layer(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
            position_embeddings=self.rotary(x, position_ids),
        )
        return out[0] if isinstance(out, tuple) else out

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(g) if self.lm_head is not None else self._bound["lm_head"](g)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self.lm_head is not None else draft_ids

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

"""A separate draft model's drafter (or the target's own first layers: early exit): a causal LM
with its own KV cache, fed the committed TOKENS (not the target's features), drafting each tree
level with one forward over the frontier under the tree's visibility mask.

Committed positions enter its cache at `observe` and stay; drafted nodes enter at `expand` and
are dropped at `end_step` (the accepted ones come back as committed tokens at the next
`observe`), the same bookkeeping as EAGLE's head cache, so its cache is rolled back on rejection
by one truncation. `observe` hands it the NEXT tokens of committed positions (the token at
position p + 1 for the target's position p): the draft model reads token p + 1 at position p + 1.
Only the prompt's first token never comes as a next token: the decoder passes it to `start`.

Early exit (the target's own first K layers) keeps no cache of its own: the target's cache already
holds exactly what those layers make of every committed token (the same modules, tokens and
positions). `observe` does nothing; before each draft (`before_draft`, the decoder's state) the
drafter runs the root alone through its K layers over the target's committed entries of those
layers, read and never written (`OverTarget`), and the tree's levels after it. Saved per step: a
K-layer forward over each committed token (1 + accepted a row); cost: each draft forward copies
the target's K layers' entries once (`torch.cat`, O(context), as transformers' own DynamicLayer).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from headstart.inference import cache as kv
from headstart.inference.drafters.common import stack_visible
from headstart.targets.features import forward, new_cache
from headstart.targets.packing import PackedLinears, packed


class OverTarget(DynamicLayer):
    """A draft layer's cache over the target's own layer of the same index: the target's entries
    (read, never written), then the draft's own (this step's root and drafted nodes)."""

    def __init__(self, target_layer: Any) -> None:
        super().__init__()
        self.target_layer = target_layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        keys, values = super().update(key_states, value_states)
        target = self.target_layer
        return torch.cat([target.keys, keys], dim=-2), torch.cat([target.values, values], dim=-2)

    def get_seq_length(self) -> int:
        return int(self.target_layer.keys.shape[-2]) + super().get_seq_length()


def over_target(target_cache: Any, layers: int) -> DynamicCache:
    """A draft cache whose first `layers` layers sit over the target cache's."""
    cache = DynamicCache()
    cache.layers = [OverTarget(target_cache.layers[i]) for i in range(layers)]
    return cache


class DraftModelDrafter:
    """Drafts from a causal LM that shares the target's tokenizer (headstart.drafts.DraftModel)."""

    feature_layers: tuple[int, ...] = ()  # reads tokens only
    max_depth: int | None = None  # autoregressive: as deep as the tree asks

    def __init__(self, draft: Any, vocab_size: int, depth: int | None = None) -> None:
        self.draft = draft
        self.model = draft.model
        self.vocab_size = vocab_size
        # early exit reads the target's own cache (module docstring); a separate draft keeps its own
        self.shared = bool(getattr(draft, "reads_target_cache", False))
        self.cache = None if self.shared else new_cache(self.model)
        self.visible: torch.Tensor | None = None  # (B, P) committed cache entries that are real
        self.committed = 0  # cache entries holding committed positions
        self.entries: list[torch.Tensor] = []  # node ids (B, k) of drafted entries, in cache order
        self.root_pos: torch.Tensor | None = None  # (B,) position of the root token
        self.root: torch.Tensor | None = None  # (B, V) draft logits of the root's children
        self.first: torch.Tensor | None = None  # (B,) the prompt's first tokens (prefill only)
        # fp32 on CPU: the draft's linears packed for a few rows, like the target's verify; early
        # exit uses the target's packer (packs are per model: another would copy the weights)
        packer = PackedLinears.for_model(draft.pack_model or self.model)
        self.packers = [packer] if packer is not None else []

    def start(self, first_tokens: torch.Tensor) -> None:
        """The token at each row's position 0 (the decoder's prefill, before the first observe)."""
        if not self.shared:  # the target's cache has it
            self.first = first_tokens

    def before_draft(self, state: Any) -> None:
        """Early exit: the root's children from the root alone, run over the target's committed
        entries of the draft's layers (`state`: the decoder's, its cache holding every committed
        position, `visible` which of its columns are real, the root not yet in it)."""
        if not self.shared:
            return
        self.cache = over_target(state.cache, int(self.model.config.num_hidden_layers))
        batch = state.root.shape[0]
        ones = state.visible.new_ones(batch, 1, 1)
        allowed = torch.cat([state.visible[:, None, :], ones], dim=-1)  # (B, 1, P + 1)
        hidden = self._forward(state.root[:, None], state.lengths[:, None], allowed)
        self.root = self._logits(hidden[:, 0])
        self.visible = torch.cat([state.visible, ones[:, 0]], dim=1)  # the root: the tree's prefix
        self.root_pos = state.lengths
        self.committed = 0

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The draft's final hidden states (B, k, H), the lm_head's input, over `tokens` (B, k) at
        `positions`, each seeing what `allowed` (B, k, cached + k) says."""
        dtype = self.draft.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]  # (B, 1, k, cached + k)
        with packed(self.packers, tokens.numel()):
            # logits_to_keep=1: transformers runs the lm_head over one position, `_logits` over
            # the ones the drafter needs
            feats = forward(self.model, tokens, attention_mask=mask, position_ids=positions,
                            past_key_values=self.cache, logits_to_keep=1)  # fmt: skip
        return feats.last_hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target-vocabulary logits of final hidden states (..., H), as the draft model's forward
        makes them (Gemma's final soft-cap, Cohere's logit scale)."""
        with packed(self.packers, hidden.numel() // hidden.shape[-1]):
            logits = self.model.get_output_embeddings()(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        scale = getattr(self.model, "logit_scale", None)
        if scale is not None:
            logits = logits * scale
        return self._in_vocab(logits)

    def _in_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary: a padded draft lm_head cut to it, a
        shorter one padded with -inf (those tokens are never drafted)."""
        width = logits.shape[-1]
        if width > self.vocab_size:
            logits = logits[..., : self.vocab_size]
        elif width < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - width), float("-inf"))
            logits = torch.cat([logits, pad], -1)
        return logits.float()

    @torch.no_grad()
    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        """Feed committed tokens: `next_tokens` (B, T) sit at `positions + 1`; the target's
        features are not read. Early exit: nothing (the target's cache holds them)."""
        if self.shared:
            return
        tokens, where, real = next_tokens, positions + 1, valid
        if self.first is not None:  # the prompt's first token, at position 0, ahead of the rest
            assert self.first is not None
            first = self.first[:, None].to(tokens.dtype)
            tokens = torch.cat([first, tokens], 1)
            where = torch.cat([torch.zeros_like(where[:, :1]), where], 1)
            real = torch.cat([torch.ones_like(valid[:, :1]), valid], 1)
            last = last + 1
            self.first = None
        batch, steps = tokens.shape
        prefix = self.visible if self.visible is not None else real.new_zeros(batch, 0)
        causal = torch.ones(steps, steps, dtype=torch.bool, device=real.device).tril()
        tree = (causal[None] & real[:, None, :]) | torch.eye(steps, dtype=torch.bool, device=real.device)
        allowed = torch.cat([prefix[:, None, :].expand(-1, steps, -1), tree], dim=-1)  # (B, T, P + T)
        # the lm_head over each row's last committed position only: SmolLM2's (49152 x 576) is a
        # fifth of its forward, and an observe after a verify holds 1 + accepted positions a row
        hidden = self._forward(tokens, where, allowed)
        rows = torch.arange(batch, device=last.device)
        self.root = self._logits(hidden[rows, last])
        self.visible = torch.cat([prefix, real], dim=1)
        self.committed = kv.cache_length(self.cache)
        self.root_pos = where[rows, last]

    def root_logits(self) -> torch.Tensor:
        assert self.root is not None, "observe() first"
        return self.root

    @torch.no_grad()
    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """One draft forward over frontier `nodes` (B, k) holding `tokens` at `depth` (position
        root + depth); `visible` (B, N, N): the tree's ancestor-or-self relation. (B, k, V)."""
        assert self.visible is not None and self.root_pos is not None
        width = nodes.shape[1]
        rows = torch.arange(nodes.shape[0], device=nodes.device)[:, None]
        sees = visible[rows, nodes]  # (B, k, N)
        drafted = [sees.gather(2, ids[:, None, :].expand(-1, width, -1)) for ids in self.entries]
        prefix = self.visible[:, None, :].expand(-1, width, -1)
        allowed = torch.cat([prefix, *drafted, sees.gather(2, nodes[:, None, :].expand(-1, width, -1))], -1)
        positions = (self.root_pos + depth)[:, None].expand(-1, width)
        hidden = self._forward(tokens, positions, allowed)
        self.entries.append(nodes)
        return self._logits(hidden)

    def end_step(self) -> None:
        """Drop the drafted entries: only committed positions stay in the draft's cache (early
        exit: none at all; the next draft reads the target's cache afresh)."""
        if self.shared:
            self.cache, self.root, self.visible, self.root_pos = None, None, None, None
        else:
            kv.truncate(self.cache, self.committed)
        self.entries = []

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.shared:  # nothing of its own between steps
            return
        kv.select_rows(self.cache, rows)
        for name in ("visible", "root_pos", "root"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[rows])

    def merge(self, other: DraftModelDrafter) -> None:
        """Append `other`'s rows between steps (requests joining a running batch)."""
        if self.shared:
            return
        assert self.visible is not None and other.visible is not None and not self.entries
        assert self.root is not None and other.root is not None
        assert self.root_pos is not None and other.root_pos is not None
        self.visible = stack_visible(self.visible, other.visible)
        kv.stack_rows(self.cache, other.cache)
        self.committed = kv.cache_length(self.cache)
        self.root = torch.cat([self.root, other.root])
        self.root_pos = torch.cat([self.root_pos, other.root_pos])

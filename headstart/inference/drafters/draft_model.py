"""A separate draft model's drafter (or the target's own first layers: early exit): a causal LM
with its own KV cache, fed the committed TOKENS (not the target's features), drafting each tree
level with one forward over the frontier under the tree's visibility mask.

Committed positions enter its cache at `observe` and stay; drafted nodes enter at `expand` and
are dropped at `end_step` (the accepted ones come back as committed tokens at the next
`observe`), the same bookkeeping as EAGLE's head cache, so its cache is rolled back on rejection
by one truncation. `observe` hands it the NEXT tokens of committed positions (the token at
position p + 1 for the target's position p): the draft model reads token p + 1 at position p + 1.
Only the prompt's first token never comes as a next token: the decoder passes it to `start`.

Under `--compile` a separate draft model's cache lives in kept buffers (`CapturedDraft`), and the
round program (inference/captured_round.py) runs its observe of the committed path and every
level's forward inside the round, the same steps over static widths at a device-held column
(`DraftRoundParts`); its steps outside the program stay eager. Early exit stays in the steps.

Early exit (the target's own first K layers) keeps no cache of its own: the target's cache already
holds exactly what those layers make of every committed token (the same modules, tokens and
positions). `observe` does nothing; before each draft (`before_draft`, the decoder's state) the
drafter runs the root alone through its K layers over the target's committed entries of those
layers, read and never written (`OverTarget`), and the tree's levels after it. Saved per step: a
K-layer forward over each committed token (1 + accepted a row); cost: each draft forward copies
the target's K layers' entries once (`torch.cat`, O(context), as transformers' own DynamicLayer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from headstart.inference import cache as kv
from headstart.inference.captured import BufferPool, StaticKV, end_views
from headstart.inference.drafters.common import drafted_visibility, stack_visible
from headstart.targets.features import cache_keyword, forward, new_cache
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
        self.captured: CapturedDraft | None = None  # --compile: the cache in kept buffers (round program)

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
            return draft_logits(self.model, hidden, self.vocab_size)

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

    # ---- the captured round (inference/captured_round.py) ------------------------------------
    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any:
        """A separate draft model's cache in kept buffers for the round program; None for early
        exit (it reads the target's cache: its rounds stay in the steps)."""
        return None if getattr(heads, "reads_target_cache", False) else CapturedDraft(heads.model)

    @property
    def runs_in_program(self) -> bool:
        """Whether its rounds may run as the round program (no round program is built for early
        exit, whose sampled eager rounds would otherwise pre-draw a program's uniforms for nothing)."""
        return not self.shared

    def capture(self, captured: Any, reserve: int) -> None:
        """The draft's cache in `captured`'s kept buffers, `reserve` entries (committed positions
        plus one round's drafted nodes)."""
        self.captured = captured
        self.cache = captured.new_cache(reserve)

    def round_inputs(self, plan: Any) -> Any:
        """What the round program takes of this drafter (RoundInputs), or None where it cannot
        run: not captured, the prompt's first token not observed yet, the cache not in its kept
        buffer, or no room for the round's drafted nodes and committed path."""
        if self.captured is None or self.first is not None or self.entries or self.root is None:
            return None
        assert self.visible is not None and self.root_pos is not None
        length = kv.cache_length(self.cache)
        claimed = self.captured.buffers.claim(
            self.cache, length, max(plan.drafted, plan.path_width), pad=False
        )
        if claimed is None:
            return None
        from headstart.inference.captured_round import visibility_buffer

        _, keys, values = claimed
        seen = visibility_buffer(self.captured.seen, self.visible, keys[0].shape[-2])
        start = self.captured.start.at(length, self.root.device)
        parts = self.captured.round_parts(self.vocab_size)
        return DraftRoundInputs(parts, (keys, values, seen, start, self.root, self.root_pos))

    def round_done(self, out: tuple[torch.Tensor, torch.Tensor], width: int) -> None:
        """The program observed `width` new entries (the committed path, padded): the Python
        side follows (views, the root's logits and position)."""
        assert self.captured is not None
        self.root, self.root_pos = out
        self.captured.start.advanced(width)
        length = kv.cache_length(self.cache) + width
        end_views(self.cache, length)
        self.visible = self.captured.seen["seen"].narrow(1, 0, length)
        self.committed = length

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


def draft_logits(model: Any, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A draft model's logits over the target's vocabulary from its final hidden states (..., H):
    its lm_head, Gemma's final soft-cap and Cohere's logit scale as its forward applies them, a
    padded lm_head cut to the target's vocabulary and a shorter one padded with -inf (never drafted)."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = getattr(model, "logit_scale", None)
    if scale is not None:
        logits = logits * scale
    width = logits.shape[-1]
    if width > vocab_size:
        logits = logits[..., :vocab_size]
    elif width < vocab_size:
        pad = logits.new_full((*logits.shape[:-1], vocab_size - width), float("-inf"))
        logits = torch.cat([logits, pad], -1)
    return logits.float()


class CapturedDraft:
    """A separate draft model's share of `--compile`: its cache in kept buffers (static
    addresses), their visibility buffer and column count as the round program reads them, and its
    round parts (one object per decoder: the program is specialised on it)."""

    def __init__(self, model: Any) -> None:
        from headstart.inference.captured_round import DeviceLength

        self.model = model
        self.buffers = BufferPool()
        self.seen: dict[str, torch.Tensor] = {}
        self.start = DeviceLength()
        self._parts: DraftRoundParts | None = None

    def new_cache(self, reserve: int) -> Any:
        cache = new_cache(self.model, reserve)
        self.buffers.adopt(cache)
        return cache

    def round_parts(self, vocab: int) -> DraftRoundParts:
        if self._parts is None or self._parts.vocab != vocab:
            self._parts = DraftRoundParts(self.model, vocab)
        return self._parts


@dataclass(frozen=True)
class DraftRoundInputs:
    """The draft model's share of the round program: its parts and tensors (its KV buffers, their
    visibility (B, C), the committed column count, the root's children's logits (B, V) and the
    root's position (B,))."""

    parts: DraftRoundParts
    tensors: tuple[Any, ...]


class DraftRoundParts:
    """DraftModelDrafter's steps inside the round program: the observe of the committed path and
    each level's forward over the kept buffers at a device-held column, with static widths."""

    def __init__(self, model: Any, vocab: int) -> None:
        self.model, self.vocab = model, vocab
        self.decoder = model.get_decoder()
        self.cache_kw = cache_keyword(type(self.decoder).forward)  # outside the graph (an lru_cache)

    def hidden(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        from headstart.targets.layer_kinds import layer_masks

        out = self.decoder(input_ids=tokens, attention_mask=layer_masks(self.model, mask), position_ids=positions,
                           **{self.cache_kw: cache}, use_cache=True)  # fmt: skip
        return out.last_hidden_state

    def drafter(self, head: tuple[Any, ...]) -> DraftProgramDrafter:
        return DraftProgramDrafter(self, head)

    def round_observe(self, last: torch.Tensor, layers: dict[int, torch.Tensor], committed: torch.Tensor,
                      positions: torch.Tensor, real: torch.Tensor, last_index: torch.Tensor,
                      head: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`observe` of the committed path (B, A): token p + 1 at position p + 1 (the target's
        features are not read), into columns [start, start + A); the root's children's logits
        (B, V) and the root's position (B,)."""
        from headstart.inference.captured_round import capacity_mask

        keys, values, seen, start, _, _ = head
        batch, width = committed.shape
        device = committed.device
        where = positions + 1
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        tree = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        dtype = next(self.model.parameters()).dtype
        mask = capacity_mask(seen, start, tree, dtype)
        hidden = self.hidden(committed, where, mask, StaticKV(keys, values, start))
        seen.index_copy_(1, start + torch.arange(width, device=device), real)
        start.add_(width)  # the next round's first column (the host counts the same)
        rows = torch.arange(batch, device=device)
        return draft_logits(self.model, hidden[rows, last_index], self.vocab), where[rows, last_index]


class DraftProgramDrafter:
    """DraftModelDrafter's `root_logits` and `expand` inside the round program: drafted nodes'
    entries go to columns start + offset of the kept buffers (offset: entries drafted so far this
    round, a Python int), the mask over the whole capacity."""

    max_depth = None

    def __init__(self, parts: DraftRoundParts, head: tuple[Any, ...]) -> None:
        self.parts = parts
        self.keys, self.values, self.seen, self.start, self.root, self.root_pos = head
        self.entries: list[torch.Tensor] = []
        self.offset = 0

    def root_logits(self) -> torch.Tensor:
        return self.root

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        from headstart.inference.captured_round import capacity_mask

        width = nodes.shape[1]
        tree = drafted_visibility(visible, nodes, self.entries)
        dtype = next(self.parts.model.parameters()).dtype
        mask = capacity_mask(self.seen, self.start, tree, dtype)
        positions = (self.root_pos + depth)[:, None].expand(-1, width)
        hidden = self.parts.hidden(
            tokens, positions, mask, StaticKV(self.keys, self.values, self.start + self.offset)
        )
        self.entries.append(nodes)
        self.offset += width
        return draft_logits(self.parts.model, hidden, self.parts.vocab)

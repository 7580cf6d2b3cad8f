"""DFlash's drafter: one block forward per step drafts every depth, and its compiled context and
block steps (`--compile`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from headstart.inference import cache as kv
from headstart.inference.captured import (
    BufferPool,
    StaticKV,
    allow_graphs,
    column,
    end_views,
    graph_mode,
    own,
    pad_nodes,
    static_mask,
    step_begins,
)
from headstart.inference.drafters.common import (
    PerDepthLogits,
    PerDepthProgram,
    in_target_vocab,
    module_device,
    packers,
    stack_visible,
)
from headstart.targets.packing import packed


class DFlashDrafter(PerDepthLogits):
    """DFlash: one block forward per step drafts every depth at once. Committed positions enter
    the head's cache as context keys and values (from the TARGET's features); the block [root,
    mask, ...] runs over them and its own keys are dropped at once. Like Medusa's, a node's
    draft does not depend on its parent's token (`expand` broadcasts the depth's logits), so a
    static tree takes the top-k per depth and a dynamic tree expands them by cumulative
    probability; the tree verifier checks them in one target forward."""

    def __init__(self, heads: Any, vocab_size: int, depth: int | None = None) -> None:
        self.heads = heads
        self.feature_layers: tuple[int, ...] = tuple(heads.feature_layers)
        self.max_depth: int | None = int(heads.max_depth)
        self.vocab_size = vocab_size
        # Only the depths the tree reaches go through the lm_head (a V x H matrix per row).
        self.depth = self.max_depth if depth is None else max(1, min(depth, self.max_depth))
        self.cache = heads.new_cache()
        self.visible: torch.Tensor | None = None  # (B, P) real entries of the context cache
        self._logits: torch.Tensor | None = None  # (B, depth, V)
        self._to_target = heads.draft_ids().to(module_device(heads)) if heads.has_draft_vocab else None
        self.packers = packers(heads)
        self.captured: Any = None  # a CapturedDFlash (decoder --compile)

    def capture(self, captured: Any, reserve: int) -> None:
        """Run the context and block steps through `captured`, the context cache in a kept buffer."""
        self.captured = captured
        self.cache = captured.new_cache(reserve)

    @torch.no_grad()
    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        """Add the committed positions (B, T) to the context, then draft the block anchored at
        the new root (the token after `last`)."""
        batch = next_tokens.shape[0]
        rows = batch * next_tokens.shape[1]
        with packed(self.packers, rows):  # eager, always (the compiled steps trace the plain linears)
            g = self.heads.fuse(last_hidden, layers)
        if self.captured is None or not self.captured.add_context(self.cache, g, positions):
            with packed(self.packers, rows):
                self.heads.add_context(g, positions, self.cache)
        prefix = self.visible if self.visible is not None else valid.new_zeros(batch, 0)
        self.visible = torch.cat([prefix, valid], dim=1)
        committed = kv.cache_length(self.cache)
        rows = torch.arange(batch, device=last.device)
        root, root_pos = next_tokens[rows, last], positions[rows, last] + 1
        states = None
        if self.captured is not None:
            size = self.heads.block_size
            tokens = torch.full((batch, size), self.heads.mask_token_id, dtype=torch.long, device=root.device)
            tokens[:, 0] = root
            states = self.captured.block(self.cache, tokens, root_pos[:, None] + torch.arange(size, device=root.device),
                                         self.visible)  # fmt: skip
        with packed(self.packers, batch * self.heads.block_size):
            if states is None:
                states = self.heads.draft_block(root, root_pos, self.visible, self.cache)  # (B, S, H)
            logits = self.heads.logits(states[:, 1 : 1 + self.depth])  # (B, depth, Vd)
        kv.truncate(self.cache, committed)  # the block's own keys: drafted, not committed
        if self._to_target is not None:
            logits = in_target_vocab(logits, self._to_target, self.vocab_size)
        self._logits = logits

    def end_step(self) -> None:
        """The block's keys were dropped in `observe`: only committed positions are cached."""

    def select_rows(self, rows: torch.Tensor) -> None:
        kv.select_rows(self.cache, rows)
        if self.visible is not None:
            self.visible = self.visible[rows]
        if self._logits is not None:
            self._logits = self._logits[rows]

    def merge(self, other: DFlashDrafter) -> None:
        """Append `other`'s rows between steps: the context caches stack, left-padded."""
        assert self.visible is not None and other.visible is not None
        assert self._logits is not None and other._logits is not None
        self.visible = stack_visible(self.visible, other.visible)
        kv.stack_rows(self.cache, other.cache)
        self._logits = torch.cat([self._logits, other._logits])

    # ---- the captured round (inference/captured_round.py) ------------------------------------
    def round_inputs(self, plan: Any) -> DFlashInputs | None:
        """What the round program takes of this drafter, or None (the steps) where its steps are
        not captured, nothing was observed yet, or the context cache has no room in its kept
        buffer for the round's path and the next block after it."""
        if self.captured is None or self._logits is None or self.visible is None:
            return None
        length = _context_length(self.cache)
        claimed = self.captured.buffers.claim(
            self.cache, length, plan.path_width + self.heads.block_size, pad=False
        )
        if claimed is None:
            return None
        from headstart.inference.captured_round import visibility_buffer

        _, keys, values = claimed
        seen = visibility_buffer(self.captured.seen, self.visible, keys[0].shape[-2])
        start = self.captured.start.at(length, self._logits.device)
        return DFlashInputs(self.captured.round_parts(self), (keys, values, seen, start, self._logits))

    def round_done(self, logits: torch.Tensor, width: int) -> None:
        """The program added `width` context entries (the committed path, padded) and drafted
        the next block: the Python side follows (views, visibility, the block's logits)."""
        self._logits = logits
        self.captured.start.advanced(width)
        length = _context_length(self.cache) + width
        end_views(self.cache, length)
        self.visible = self.captured.seen["seen"].narrow(1, 0, length)

    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any:
        """Its context and block steps as graphs (`--compile`)."""
        return CapturedDFlash(heads, backend=backend)


class CapturedDFlash:
    """A DFlash head's two steps compiled: adding the committed positions' keys and values to its
    context cache (bucketed like the verify) and the block forward over that cache (the block
    size is fixed: one graph). Its cache is a growing cache in a kept buffer; the block's own
    entries land after the context and are dropped (a shorter view). The lm_head over the block
    states runs outside the graph (the head caches its draft-vocabulary rows in Python)."""

    def __init__(self, heads: Any, backend: str = "inductor", mode: str | None = None) -> None:
        self.heads = heads
        mode = graph_mode(heads, mode)
        self.context_fn, self.block_fn = _compiled_dflash(backend, mode)
        self.buffers = BufferPool()
        self.seen: dict[str, torch.Tensor] = {}  # the round program's visibility buffer of the context
        from headstart.inference.captured_round import DeviceLength

        self.start = DeviceLength()  # the context cache's column count, as the round program reads it
        self._parts: dict[tuple[int, bool, int], DFlashParts] = {}
        self.steps = 0
        self.fallbacks = 0

    def round_parts(self, drafter: DFlashDrafter) -> DFlashParts:
        """The head's share of the round program, one object per decoder and depth (the program
        is specialized on it)."""
        draft_vocab = drafter._to_target is not None
        key = (drafter.depth, draft_vocab, drafter.vocab_size)
        parts = self._parts.get(key)
        if parts is None:
            rows = self.heads.draft_rows() if draft_vocab else None  # a Python cache: outside
            parts = self._parts[key] = DFlashParts(self.heads, drafter.depth, rows, drafter._to_target,
                                                   drafter.vocab_size)  # fmt: skip
        return parts

    def new_cache(self, reserve: int) -> Any:
        from headstart.targets.growing_cache import growing_cache

        cache = growing_cache(self.heads.layer_config, reserve)
        self.buffers.adopt(cache)
        return cache

    def add_context(self, cache: Any, g: torch.Tensor, positions: torch.Tensor) -> bool:
        """Append g (B, T, H) at `positions` to the context; False: do it eagerly."""
        batch, count = positions.shape
        length = _context_length(cache)
        claimed = self.buffers.claim(cache, length, count)
        if claimed is None:
            self.fallbacks += 1
            return False
        size, keys, values = claimed
        if size > count:
            g = torch.cat([g, g.new_zeros(batch, size - count, g.shape[-1])], 1)
        start = column(length, g.device)
        step_begins(g.device)
        self.context_fn(self.heads, g.contiguous(), pad_nodes(positions, size), start, keys, values)
        end_views(cache, length + count)
        self.steps += 1
        return True

    def block(self, cache: Any, tokens: torch.Tensor, positions: torch.Tensor,
              visible: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """The block's normed states (B, S, H) over the context (`visible` (B, P) its real
        entries); None: run it eagerly. The block's own entries are dropped after."""
        batch, size = tokens.shape
        length = visible.shape[1]
        claimed = self.buffers.claim(cache, length, size, pad=False)
        if claimed is None:
            self.fallbacks += 1
            return None
        _, keys, values = claimed
        block = torch.ones(batch, size, size, dtype=torch.bool, device=tokens.device)
        allowed = torch.cat([visible[:, None, :].expand(batch, size, length), block], dim=-1)
        mask = static_mask(allowed, size, keys[0].shape[-2], self.heads.fc.weight.dtype)
        start = column(length, tokens.device)
        step_begins(tokens.device)
        states = own(
            self.block_fn(self.heads, tokens.contiguous(), positions.contiguous(), mask, start, keys, values)
        )
        end_views(cache, length)
        self.steps += 1
        return states


def _context_length(cache: Any) -> int:
    """Entries in the context cache (0 while its layers hold nothing yet: inference.cache's
    `cache_length` reads keys a fresh growing cache does not have)."""
    layer = cache.layers[0]
    keys = getattr(layer, "keys", None)
    return int(keys.shape[-2]) if keys is not None and keys.dim() == 4 else 0


def _dflash_context(heads: Any, g: torch.Tensor, positions: torch.Tensor, start: torch.Tensor,
                    keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:  # fmt: skip
    heads.add_context(g, positions, StaticKV(keys, values, start))


def _dflash_block(heads: Any, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                  start: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
    return heads.block(tokens, positions, mask, StaticKV(keys, values, start))


@functools.cache
def _compiled_dflash(backend: str, mode: str | None) -> tuple[Any, Any]:
    allow_graphs()
    return (
        torch.compile(_dflash_context, fullgraph=True, backend=backend, mode=mode, dynamic=False),
        torch.compile(_dflash_block, fullgraph=True, backend=backend, mode=mode, dynamic=False),
    )


@dataclass(frozen=True)
class DFlashInputs:
    parts: DFlashParts
    tensors: tuple[Any, ...]  # the context's KV buffers, visibility, column count; the block's logits


class DFlashParts:
    """DFlash's share of the round program: the tree's draft reads the block's per-depth logits,
    and the observe adds the committed path to the context at the device-held column (A entries,
    those past a row's path unseen), then runs the next block over it (DFlashDrafter.observe's
    steps with static widths; the block's own entries, written after the path, are never seen
    and the next round's context overwrites them)."""

    def __init__(self, heads: Any, depth: int, rows: torch.Tensor | None, to_target: torch.Tensor | None,
                 vocab: int) -> None:  # fmt: skip
        self.heads, self.depth, self.rows, self.to_target, self.vocab = heads, depth, rows, to_target, vocab

    def drafter(self, head: tuple[Any, ...]) -> PerDepthProgram:
        return PerDepthProgram(head[4])

    def round_observe(self, last: torch.Tensor, layers: dict[int, torch.Tensor], committed: torch.Tensor,
                      positions: torch.Tensor, real: torch.Tensor, last_index: torch.Tensor,
                      head: tuple[Any, ...]) -> torch.Tensor:  # fmt: skip
        from headstart.inference.captured_round import capacity_mask

        keys, values, seen, start, _ = head
        batch, width = committed.shape
        device = committed.device
        self.heads.add_context(self.heads.fuse(last, layers), positions, StaticKV(keys, values, start))
        seen.index_copy_(1, start + torch.arange(width, device=device), real)
        rows = torch.arange(batch, device=device)
        root, root_pos = committed[rows, last_index], positions[rows, last_index] + 1
        size = self.heads.block_size
        tokens = torch.full((batch, size), self.heads.mask_token_id, dtype=torch.long, device=device)
        tokens[:, 0] = root
        block = torch.ones(1, size, size, dtype=torch.bool, device=device)
        after = start + width  # the block's first column
        mask = capacity_mask(seen, after, block, self.heads.fc.weight.dtype)
        states = self.heads.block(tokens, root_pos[:, None] + torch.arange(size, device=device), mask,
                                  StaticKV(keys, values, after))  # fmt: skip
        start.add_(width)  # the next round's first column (the host counts the same)
        states = states[:, 1 : 1 + self.depth]
        if self.rows is None:
            return self.heads.bound("lm_head")(states)
        logits = torch.nn.functional.linear(states, self.rows)
        return in_target_vocab(logits, self.to_target, self.vocab) if self.to_target is not None else logits

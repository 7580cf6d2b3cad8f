"""EAGLE-1/2/3's drafter: an autoregressive head with its own KV cache, and its compiled step
(`--compile`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from headstart.errors import HeadstartError
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
    drafted_visibility,
    in_target_vocab,
    module_device,
    packers,
    stack_visible,
)
from headstart.targets.packing import packed


class EagleDrafter:
    """EAGLE-1/2/3: an autoregressive head with its own KV cache. Committed positions enter the
    cache with the TARGET's features; drafted nodes enter it with the head's own guesses and
    are dropped at `end_step` (the accepted ones come back with target features at `observe`)."""

    def __init__(self, heads: Any, vocab_size: int, depth: int | None = None) -> None:
        """`depth` is unused: an autoregressive head drafts as deep as the tree asks."""
        self.heads = heads
        self.feature_layers: tuple[int, ...] = tuple(heads.feature_layers)
        self.max_depth: int | None = None
        self.vocab_size = (
            vocab_size
            if vocab_size is not None
            else getattr(getattr(heads, "config", None), "vocab_size", None)
        )
        draft_ids = torch.arange(int(heads.draft_vocab_size))
        self._to_target = heads.draft_to_target(draft_ids.to(module_device(heads))).long()  # (Vd,)
        if self._to_target.numel() and int(self._to_target.max()) >= vocab_size:
            raise HeadstartError("the head's draft vocabulary maps outside the target vocabulary (bad d2t)",
                                 "re-export the head for this target")  # fmt: skip
        self._identity = self._to_target.numel() == vocab_size and bool(
            (self._to_target == draft_ids.to(self._to_target.device)).all()
        )
        self.cache = heads.new_cache()
        self.visible: torch.Tensor | None = None  # (B, P) committed head-cache entries that are real
        self.committed = 0  # head-cache entries that hold committed positions
        self.g: torch.Tensor | None = None  # (B, N, H): g computed at each drafted node (0 = root)
        self.entries: list[torch.Tensor] = []  # node ids (B, k) of drafted entries, in cache order
        self.root_pos: torch.Tensor | None = None  # (B,) position id of the root token
        self.packers = packers(heads)
        self.captured: Any = None  # a CapturedHead (decoder --compile): the head's steps as graphs

    def capture(self, captured: Any, reserve: int) -> None:
        """Run the head's steps through `captured` (inference/captured.py), its cache in a kept
        buffer of `reserve` entries: committed positions plus one step's drafted nodes."""
        self.captured = captured
        self.cache = captured.new_cache(reserve)

    def _step(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
              logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """g (B, k, H) of the head over `tokens` (B, k) at `positions`, each node seeing what
        `allowed` (B, k, cached + k) says, and with `logits` its target-vocabulary logits."""
        if self.captured is not None:
            to_target = None if self._identity else self._to_target
            out = self.captured.step(self.cache, hidden, tokens, positions, allowed, to_target, self.vocab_size,
                                     logits)  # fmt: skip
            if out is not None:
                return out
        mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
        mask = mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[:, None]  # (B, 1, k, kv)
        with packed(self.packers, tokens.numel()):
            g = self.heads(
                hidden, tokens, position_ids=positions, attention_mask=mask, past_key_values=self.cache
            )
            return g, (self._target_logits(g) if logits else None)

    def _target_logits(self, g: torch.Tensor) -> torch.Tensor:
        logits = self.heads.logits(g)  # (..., Vd)
        if self._identity:
            return logits
        return in_target_vocab(logits, self._to_target, self.vocab_size)

    @torch.no_grad()
    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        """Feed committed positions: target features (B, T, H) with the NEXT tokens (B, T)."""
        batch, steps = next_tokens.shape
        with packed(self.packers, batch * steps):  # the 3H -> H fc: 0.32 ms a step through F.linear
            hidden = self.heads.fuse(last_hidden, layers)  # (B, T, H)
        prefix = self.visible if self.visible is not None else valid.new_zeros(batch, 0)
        causal = torch.ones(steps, steps, dtype=torch.bool, device=valid.device).tril()
        tree = (causal[None] & valid[:, None, :]) | torch.eye(steps, dtype=torch.bool, device=valid.device)
        allowed = torch.cat([prefix[:, None, :].expand(-1, steps, -1), tree], dim=-1)  # (B, T, P + T)
        g, _ = self._step(hidden, next_tokens, positions, allowed, logits=False)
        self.visible = torch.cat([prefix, valid], dim=1)
        self.committed = kv.cache_length(self.cache)
        rows = torch.arange(batch, device=last.device)
        self.g = g[rows, last][:, None]  # (B, 1, H): the root's g
        self.root_pos = positions[rows, last] + 1

    def root_logits(self) -> torch.Tensor:
        assert self.g is not None, "observe() first"
        # packed as in `_step`: the draft lm_head through PyTorch's F.linear cost 1.1 ms a step on
        # SmolLM2 (all of a chain:1 tree's drafting), the kernel ~0.3
        with torch.no_grad(), packed(self.packers, self.g.shape[0]):
            return self._target_logits(self.g[:, 0])

    @torch.no_grad()
    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """One head step for frontier `nodes` (B, k) holding `tokens` at `depth`; `visible` (B, N, N)
        is the ancestor-or-self relation of the tree so far. Returns child logits (B, k, V)."""
        assert self.g is not None and self.visible is not None and self.root_pos is not None
        batch, width = nodes.shape
        rows = torch.arange(batch, device=nodes.device)[:, None]
        if self.g.shape[1] < visible.shape[1]:  # grow the per-node g table to the pool size
            pad = self.g.new_zeros(batch, visible.shape[1] - self.g.shape[1], self.g.shape[2])
            self.g = torch.cat([self.g, pad], dim=1)
        hidden = self.g[rows, parents]  # (B, k, H): the g that predicted each node's token
        prefix = self.visible[:, None, :].expand(-1, width, -1)
        allowed = torch.cat([prefix, drafted_visibility(visible, nodes, self.entries)], dim=-1)
        positions = (self.root_pos + depth - 1)[:, None].expand(-1, width)
        g, logits = self._step(hidden, tokens, positions, allowed, logits=True)
        assert logits is not None
        self.entries.append(nodes)
        self.g[rows, nodes] = g
        return logits

    def end_step(self) -> None:
        """Drop the drafted entries: only committed positions stay in the head's cache."""
        kv.truncate(self.cache, self.committed)
        self.entries = []

    def select_rows(self, rows: torch.Tensor) -> None:
        kv.select_rows(self.cache, rows)
        for name in ("visible", "g", "root_pos"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[rows])

    def merge(self, other: EagleDrafter) -> None:
        """Append `other`'s rows between steps (requests joining a running batch): the head's
        caches stack, left-padded to one width with entries no row sees."""
        assert self.visible is not None and other.visible is not None and not self.entries
        self.visible = stack_visible(self.visible, other.visible)
        kv.stack_rows(self.cache, other.cache)
        self.committed = kv.cache_length(self.cache)
        assert self.g is not None and other.g is not None and self.root_pos is not None
        self.g = torch.cat([self.g[:, :1], other.g[:, :1]])  # the root's g: all a step starts from
        self.root_pos = torch.cat([self.root_pos, other.root_pos])

    # ---- the captured round (inference/captured_round.py) ------------------------------------
    def round_inputs(self, plan: Any) -> Any:
        """What the round program takes of this drafter (RoundInputs), or None where it cannot
        run: the head's steps not captured, the cache not in its kept buffer, or no room for the
        round's drafted entries and committed path."""
        if (
            self.captured is None
            or self.g is None
            or self.visible is None
            or self.root_pos is None
            or self.entries
        ):
            return None
        length = kv.cache_length(self.cache)
        claimed = self.captured.buffers.claim(
            self.cache, length, max(plan.drafted, plan.path_width), pad=False
        )
        if claimed is None or self.g.shape[1] != 1:
            return None
        from headstart.inference.captured_round import visibility_buffer

        _, keys, values = claimed
        seen = visibility_buffer(self.captured.seen, self.visible, keys[0].shape[-2])
        start = self.captured.start.at(length, self.g.device)
        return RoundInputs(
            self.captured.round_parts(self), (keys, values, seen, start, self.g, self.root_pos)
        )

    def round_done(self, out: tuple[torch.Tensor, torch.Tensor], width: int) -> None:
        """The round program observed `width` new entries (the committed path, padded): the
        Python side of the head's state follows (views, the root's g and position)."""
        self.g, self.root_pos = out
        self.captured.start.advanced(width)
        length = kv.cache_length(self.cache) + width
        end_views(self.cache, length)
        self.visible = self.captured.seen["seen"].narrow(1, 0, length)
        self.committed = length

    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any:
        """The head's step as graphs (`--compile`), for headstart's own decoder layer."""
        return CapturedHead(heads, backend=backend) if hasattr(heads, "midlayer") else None


class CapturedHead:
    """An EAGLE head's step (its one decoder layer over its own KV cache, then its logits over
    the target vocabulary) compiled the same way: the head's cache is a growing cache in a kept
    buffer, new entries written at a device-held column, the mask over every column, the nodes
    padded to a bucket. One graph per (rows, nodes) shape: a static tree's levels have fixed
    widths, the committed tokens an `observe` feeds are bucketed; a prompt-sized `observe` (the
    prefill) runs eagerly, into the same buffer."""

    def __init__(self, heads: Any, backend: str = "inductor", mode: str | None = None) -> None:
        self.heads = heads
        mode = graph_mode(heads, mode)
        self.fn = _compiled_head(backend, mode)
        self.buffers = BufferPool()
        self.seen: dict[str, torch.Tensor] = {}  # the captured round's visibility buffer of the head's cache
        from headstart.inference.captured_round import DeviceLength

        self.start = DeviceLength()  # the head cache's column count, as the round program reads it
        self._parts: RoundParts | None = None
        self.steps = 0
        self.fallbacks = 0

    def round_parts(self, drafter: EagleDrafter) -> RoundParts:
        """The head's pieces of the round program, one object per decoder (the program is
        specialized on it: a new one per generation would recompile it)."""
        to_target = None if drafter._identity else drafter._to_target
        if self._parts is None or self._parts.vocab != drafter.vocab_size:
            self._parts = RoundParts(self.heads, to_target, int(drafter.vocab_size))
        return self._parts

    def new_cache(self, reserve: int) -> Any:
        """The head's cache for one generation: `reserve` entries (rounded up), zeroed, in the
        pool's buffers when they fit."""
        from headstart.targets.growing_cache import growing_cache

        cache = growing_cache(self.heads.midlayer.config, reserve)
        self.buffers.adopt(cache)
        return cache

    def step(self, cache: Any, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             allowed: torch.Tensor, to_target: torch.Tensor | None, vocab: int,
             with_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:  # fmt: skip
        """g (B, k, H) and, `with_logits`, target-vocabulary logits (B, k, V) of the head over
        `tokens` (B, k); `allowed` (B, k, length + k): which cached entries and new nodes each
        node sees. None: run it eagerly."""
        batch, k = tokens.shape
        length = allowed.shape[-1] - k
        claimed = self.buffers.claim(cache, length, k)
        if claimed is None:
            self.fallbacks += 1
            return None
        size, keys, values = claimed
        mask = static_mask(allowed, size, keys[0].shape[-2], hidden.dtype)
        hidden = (
            torch.cat([hidden, hidden.new_zeros(batch, size - k, hidden.shape[-1])], 1)
            if size > k
            else hidden
        )
        start = column(length, tokens.device)
        step_begins(tokens.device)
        g, logits = own(self.fn(self.heads, hidden.contiguous(), pad_nodes(tokens, size),
                                 pad_nodes(positions, size), mask, start, keys, values, to_target, vocab,
                                 with_logits))  # fmt: skip
        end_views(cache, length + k)
        self.steps += 1
        return g[:, :k], (logits[:, :k] if logits is not None else None)


def _head_graph(heads: Any, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                start: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                to_target: torch.Tensor | None, vocab: int, with_logits: bool) -> Any:  # fmt: skip
    """The head step that is compiled (see CapturedHead.step)."""
    g = heads(hidden, tokens, position_ids=positions, attention_mask=mask,
              past_key_values=StaticKV(keys, values, start))  # fmt: skip
    if not with_logits:
        return g, None
    logits = heads.logits(g)
    return g, (in_target_vocab(logits, to_target, vocab) if to_target is not None else logits)


@functools.cache
def _compiled_head(backend: str, mode: str | None) -> Any:
    allow_graphs()
    return torch.compile(_head_graph, fullgraph=True, backend=backend, mode=mode, dynamic=False)


@dataclass(frozen=True)
class RoundInputs:
    """An EAGLE drafter's share of the round program: its pieces and its tensors (the head's KV
    buffers, their visibility (B, Ch), the committed column count, the root's g (B, 1, H) and
    position (B,))."""

    parts: RoundParts
    tensors: tuple[Any, ...]


class RoundParts:
    """The head's share of the round program (inference/captured_round.py), traced with the
    target's verify: a drafter for the tree's draft (`ProgramDrafter`) and the observe of the
    committed path, the same steps as EagleDrafter's over the kept buffers at a device-held
    column, with static widths."""

    def __init__(self, heads: Any, to_target: torch.Tensor | None, vocab: int) -> None:
        self.heads, self.to_target, self.vocab = heads, to_target, vocab

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        logits = self.heads.logits(g)
        return in_target_vocab(logits, self.to_target, self.vocab) if self.to_target is not None else logits

    def draft_logits(self, g: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The logits of the children of nodes whose g is `g` (B, k, H); `positions` (B, k): where
        those children sit (unused here: a seam for scripted drafts in tests)."""
        return self.logits(g)

    def drafter(self, head: tuple[Any, ...]) -> ProgramDrafter:
        """The drafter the tree's draft calls inside the program (root_logits, expand)."""
        return ProgramDrafter(self, head)

    def round_observe(self, last: torch.Tensor, layers: dict[int, torch.Tensor], committed: torch.Tensor,
                      positions: torch.Tensor, real: torch.Tensor, last_index: torch.Tensor,
                      head: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`observe` of the committed path (B, A) at columns [start, start + A): the root's next
        g (B, 1, H) and position (B,)."""
        from headstart.inference.captured_round import capacity_mask

        keys, values, seen, start, _, _ = head
        batch, width = committed.shape
        device = committed.device
        hidden = self.heads.fuse(last, layers)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        tree = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        mask = capacity_mask(seen, start, tree, hidden.dtype)
        g = self.heads(hidden, committed, position_ids=positions, attention_mask=mask,
                       past_key_values=StaticKV(keys, values, start))  # fmt: skip
        seen.index_copy_(1, start + torch.arange(width, device=device), real)
        start.add_(width)  # the next round's first column (the host counts the same)
        rows = torch.arange(batch, device=device)
        return g[rows, last_index][:, None], positions[rows, last_index] + 1


class ProgramDrafter:
    """EagleDrafter's `root_logits` and `expand` inside the round program: the head's entries for
    drafted nodes go to columns start + offset of its kept buffers (offset: entries drafted so
    far this round, a Python int: the tree's levels have fixed widths), the mask over the whole
    capacity (committed entries as `seen` says, drafted ones as the tree's visibility says)."""

    max_depth = None

    def __init__(self, parts: RoundParts, head: tuple[Any, ...]) -> None:
        self.parts = parts
        self.keys, self.values, self.seen, self.start, g_root, self.root_pos = head
        self.g = g_root  # (B, N, H): each drafted node's g, grown to the tree's pool (0 = the root)
        self.entries: list[torch.Tensor] = []  # node ids (B, k) of drafted entries, in cache order
        self.offset = 0

    def root_logits(self) -> torch.Tensor:
        children = self.root_pos[:, None] + 1  # where the root's children sit
        return self.parts.draft_logits(self.g[:, :1], children)[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        from headstart.inference.captured_round import capacity_mask

        batch, width = nodes.shape
        rows = torch.arange(batch, device=nodes.device)[:, None]
        if self.g.shape[1] < visible.shape[1]:
            pad = self.g.new_zeros(batch, visible.shape[1] - self.g.shape[1], self.g.shape[2])
            self.g = torch.cat([self.g, pad], dim=1)
        tree = drafted_visibility(visible, nodes, self.entries)
        mask = capacity_mask(self.seen, self.start, tree, self.g.dtype)
        positions = (self.root_pos + depth - 1)[:, None].expand(-1, width)
        g = self.parts.heads(self.g[rows, parents], tokens, position_ids=positions, attention_mask=mask,
                             past_key_values=StaticKV(self.keys, self.values, self.start + self.offset))  # fmt: skip
        self.entries.append(nodes)
        self.offset += width
        self.g = self.g.index_put((rows.expand(-1, width), nodes), g)
        return self.parts.draft_logits(g, positions + 2)  # the children sit at the root's + depth + 1

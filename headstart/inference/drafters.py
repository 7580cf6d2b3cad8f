"""Drafters: the decoder's view of a head (see headstart.heads.base for the contract).

A drafter sees the target's features of every newly committed position (`observe`), gives the
draft logits of the root's children (`root_logits`), and expands frontier nodes of the tree
being drafted (`expand`), all batched over rows and frontier nodes. Logits are always over the
TARGET vocabulary: an EAGLE-3 draft vocabulary is mapped back through `draft_to_target` (d2t),
non-draft tokens get -inf.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.inference import cache as kv
from headstart.target.packing import PackedLinears, packed


def _packers(heads: Any) -> list[PackedLinears]:
    """Packers for the head and the target modules it borrows (a shared lm_head): a draft step
    over 4+ rows hits the same MKL cliff as the verify (an 8192-row draft lm_head: 1.1 ms for 1
    row, 2.8 for 4, 4.8 for 8; packed 1.4 and 1.9). None off CPU fp32."""
    bound = dict(getattr(heads, "_bound", {}))
    if isinstance(getattr(heads, "lm_head", None), nn.Module):
        # EAGLE-3 drafts with its own lm_head: packing the target's would only cost memory
        bound.pop("lm_head", None)
    modules = [heads, *bound.values()]
    found = (PackedLinears.for_model(m) for m in modules if isinstance(m, nn.Module))
    return [p for p in found if p is not None]


def in_target_vocab(logits: torch.Tensor, to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits (..., Vd) as target-vocabulary logits (..., V), -inf off the draft
    vocabulary (so sampling's q is exactly the distribution the drafts come from)."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return full.scatter(-1, to_target.expand_as(logits), logits)


class MedusaDrafter:
    """Medusa: head k at the last committed position's feature predicts the token at depth k;
    the draft does not depend on the parent's token, so `expand` only broadcasts."""

    def __init__(self, heads: Any, depth: int | None = None, vocab_size: int | None = None) -> None:
        self.heads = heads
        self.feature_layers: tuple[int, ...] = tuple(heads.feature_layers)
        self.max_depth: int | None = int(heads.num_heads)  # head k drafts depth k
        self.vocab_size = (
            vocab_size
            if vocab_size is not None
            else getattr(getattr(heads, "config", None), "vocab_size", None)
        )
        # Only the heads the tree reaches run: a chain of 1 needs head 1 alone (each head costs a
        # V x H projection per step).
        self.depth = self.max_depth if depth is None else max(1, min(depth, self.max_depth))
        self._logits: torch.Tensor | None = None  # (B, K, V): head k's logits at the last feature
        self.packers = _packers(heads)
        # A draft vocabulary: project onto its Vd rows only (`in_target_vocab` maps back)
        self._to_target = (
            heads.draft_ids().to(_device(heads)) if getattr(heads, "has_draft_vocab", False) else None
        )
        self.captured: Any = None  # a CapturedMedusa (decoder --compile)

    def capture(self, captured: Any, reserve: int) -> None:
        """Run the heads through `captured` (no cache: `reserve` is not needed)."""
        self.captured = captured

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        rows = torch.arange(last_hidden.shape[0], device=last.device)
        hidden = last_hidden[rows, last][:, None]  # (B, 1, H)
        draft_vocab = self._to_target is not None
        if self.captured is not None:  # --compile: one graph
            logits = self.captured(hidden, self.depth, draft_vocab)
        else:
            with torch.no_grad(), packed(self.packers, self.depth * hidden.shape[0]):  # the stacked lm_head
                if not draft_vocab:
                    logits = self.heads(hidden, self.depth)  # (K, B, 1, V)
                else:
                    logits = self.heads.draft_logits(hidden, self.depth)  # (K, B, 1, Vd)
        logits = logits[:, :, 0].transpose(0, 1)  # (B, K, V or Vd)
        if self._to_target is not None:
            logits = in_target_vocab(logits, self._to_target, self.vocab_size)
        self._logits = logits  # (B, K, V)

    def root_logits(self) -> torch.Tensor:
        assert self._logits is not None, "observe() first"
        return self._logits[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Logits (B, k, V) of the children of `nodes` (B, k) at `depth` (their children sit at depth + 1)."""
        assert self._logits is not None
        return self._logits[:, depth][:, None].expand(-1, nodes.shape[1], -1)

    def end_step(self) -> None:
        """Nothing drafted is cached by Medusa heads."""

    def select_rows(self, rows: torch.Tensor) -> None:
        if self._logits is not None:
            self._logits = self._logits[rows]

    def merge(self, other: MedusaDrafter) -> None:
        """Append `other`'s rows (requests joining a running batch)."""
        assert self._logits is not None and other._logits is not None
        self._logits = torch.cat([self._logits, other._logits])


class EagleDrafter:
    """EAGLE-1/2/3: an autoregressive head with its own KV cache. Committed positions enter the
    cache with the TARGET's features; drafted nodes enter it with the head's own guesses and
    are dropped at `end_step` (the accepted ones come back with target features at `observe`)."""

    def __init__(self, heads: Any, vocab_size: int) -> None:
        self.heads = heads
        self.feature_layers: tuple[int, ...] = tuple(heads.feature_layers)
        self.max_depth: int | None = None
        self.vocab_size = (
            vocab_size
            if vocab_size is not None
            else getattr(getattr(heads, "config", None), "vocab_size", None)
        )
        draft_ids = torch.arange(int(heads.draft_vocab_size))
        self._to_target = heads.draft_to_target(draft_ids.to(_device(heads))).long()  # (Vd,)
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
        self.packers = _packers(heads)
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
        sees = visible[rows, nodes]  # (B, k, N)
        drafted = [sees.gather(2, ids[:, None, :].expand(-1, width, -1)) for ids in self.entries]
        prefix = self.visible[:, None, :].expand(-1, width, -1)
        allowed = torch.cat(
            [prefix, *drafted, sees.gather(2, nodes[:, None, :].expand(-1, width, -1))], dim=-1
        )
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
        self.visible = _stack_visible(self.visible, other.visible)
        kv.stack_rows(self.cache, other.cache)
        self.committed = kv.cache_length(self.cache)
        assert self.g is not None and other.g is not None and self.root_pos is not None
        self.g = torch.cat([self.g[:, :1], other.g[:, :1]])  # the root's g: all a step starts from
        self.root_pos = torch.cat([self.root_pos, other.root_pos])


class DFlashDrafter:
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
        self._to_target = heads.draft_ids().to(_device(heads)) if heads.has_draft_vocab else None
        self.packers = _packers(heads)
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

    def root_logits(self) -> torch.Tensor:
        assert self._logits is not None, "observe() first"
        return self._logits[:, 0]

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Logits (B, k, V) of the children of `nodes` (B, k) at `depth`: the block's slot depth + 1."""
        assert self._logits is not None
        return self._logits[:, depth][:, None].expand(-1, nodes.shape[1], -1)

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
        self.visible = _stack_visible(self.visible, other.visible)
        kv.stack_rows(self.cache, other.cache)
        self._logits = torch.cat([self._logits, other._logits])


def _stack_visible(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Two (B, P) visibility masks stacked, the narrower left-padded with False (kv.stack_rows)."""
    width = max(mine.shape[1], theirs.shape[1])
    pad = [torch.cat([m.new_zeros(m.shape[0], width - m.shape[1]), m], dim=1) for m in (mine, theirs)]
    return torch.cat(pad)


def _device(module: Any) -> torch.device:
    try:
        return next(module.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


class PlainDrafter:
    """No heads: every tree is the root alone, so a step is one token of plain decoding (or a
    prompt-lookup branch, `--tree +lookup:K`) through the same engine and verifier."""

    feature_layers: tuple[int, ...] = ()
    max_depth: int | None = 0

    def __init__(self) -> None:
        self.batch = 0

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        self.batch = next_tokens.shape[0]

    def root_logits(self) -> torch.Tensor:
        return torch.zeros(self.batch, 1)  # never ranked: the tree has no level to fill

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        raise AssertionError("a root-only tree has nothing to expand")

    def end_step(self) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        self.batch = int(rows.shape[0])

    def merge(self, other: PlainDrafter) -> None:
        self.batch += other.batch


def make_drafter(heads: Any, vocab_size: int, depth: int | None = None) -> Any:
    """The drafter for `heads`; an object that already is a drafter (observe/root_logits/expand,
    e.g. a scripted test drafter) is used as is. `depth`: how deep the tree drafts (None: as deep
    as the heads can)."""
    if heads is None:  # plain decoding
        return PlainDrafter()
    if all(hasattr(heads, name) for name in ("observe", "root_logits", "expand", "end_step")):
        return heads
    kind = getattr(heads, "kind", None)
    if kind == "medusa":
        return MedusaDrafter(heads, depth, vocab_size)
    if kind in ("eagle", "eagle3"):
        return EagleDrafter(heads, vocab_size)
    if kind == "dflash":
        return DFlashDrafter(heads, vocab_size, depth)
    raise HeadstartError(
        f"unknown head kind {kind!r}", "load heads saved by `headstart train` (medusa, eagle, eagle3)"
    )

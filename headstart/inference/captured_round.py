"""The whole steady-state speculative round as ONE compiled program (`--compile`, greedy or exact
sampling, a tree drafted from the heads alone: static, chain or dynamic; a drafter with round
parts: EAGLE-1/2/3, Medusa, DFlash, the replay drafter):
draft every level, verify, accept, commit the KV cache and feed the head, with no host read
inside and no eager op between the phases.

    inputs:  the target's KV buffers, its visibility (B, C), the cache's column count P (a 0-d
             device tensor); the head's KV buffers, visibility (B, Ch) and column count Ph; each
             row's length (its root's position), root token and the drafter's root state (EAGLE: g)
    program: draft (the tree's own draft function, trees.draft.RoundPlan, over the drafter's
             in-program twin: every level's top-k and head step, a dynamic tree's selection to
             its node budget) -> verify (one target forward over the n nodes at columns
             [P, P + n)) -> acceptance (accept_greedy, or accept_sampling over uniforms drawn
             before the program: static shapes) -> commit: the
             accepted path's entries gathered into columns [P, P + A), their visibility set, the
             drafter observing them at [Ph, Ph + A); P and Ph advanced by A in place
    outputs: a report (B, 1 + A): each row's count then its committed tokens; the next lengths,
             roots and drafter root state

A = the tree's depth + 1: every round appends A columns to both caches whatever it accepted,
the columns past a row's accepted path masked (never seen). So P and Ph advance by a number the
host knows before the round runs: the Python views of both caches stay right without reading
anything back, which is what lets the engine queue round k + 1 before it reads round k. Cost: the
caches' capacity holds max_new_tokens * A columns (worst case: nothing accepted), where the eager
commit needs the tokens accepted; a captured verify attends over its whole capacity anyway.

Sampling: the program drafts as the steps do (a static tree's children drawn without replacement
from the warped draft distribution q by Gumbel-top-k; a dynamic tree's deterministic, scored by
the warped q) and accepts by the same exact tree rejection sampling (verify.accept_sampling). Its
uniforms are drawn before the program, one (B, K) draw a round from the batch's or each row's
generator (sampling.PreDrawn), K = the static draft's noise (V a frontier node a level) + depth *
(n - 1) coin flips (an upper bound) + 1 for the bonus: a seeded generation repeats, a seeded row's
draws do not depend on its batch, and the program's tree equals the steps' over the same draws.
(A seed's tokens still differ between the program and the steps: the steps draw one call at a
time.)

Where the program cannot run (rows joined or left and the caches are fresh tensors, the capacity
is full, typical acceptance, a lookup branch), `run` returns None and the engine takes the eager steps,
which leave both caches and the visibility in a state the next program run adopts (one copy of
the visibility into this object's buffer, only then).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from headstart.inference.captured import allow_graphs, end_views, graph_mode, own, step_begins
from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import Generator, PreDrawn, uniform
from headstart.inference.trees.draft import GREEDY
from headstart.inference.verify import accept_greedy, accept_sampling, committed_path


def warp_of(sampling: SamplingConfig) -> SamplingConfig:
    """What a round program traces of a generation's sampling: the warp alone (temperature,
    top-k, top-p), so a new length or seed never recompiles it (one object per warp)."""
    return GREEDY if sampling.greedy else _warp(sampling.temperature, sampling.top_p, sampling.top_k)


@functools.lru_cache(maxsize=64)  # a server's requests bring their own warps: bounded
def _warp(temperature: float, top_p: float, top_k: int) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k)


def capacity_mask(
    seen: torch.Tensor, length: torch.Tensor, tree: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """(B, 1, k, C) additive mask over a cache's whole capacity: columns before `length` (a 0-d
    device tensor) as `seen` (B, C) says, the E columns from `length` on as `tree` (B or 1, k, E)
    says, none after. Static shapes: the offset is data, not a shape."""
    batch, capacity = seen.shape
    k, width = tree.shape[-2:]
    cols = torch.arange(capacity, device=seen.device)
    before = (seen & (cols < length)[None])[:, None, :]  # (B, 1, C)
    offset = cols - length
    inside = (offset >= 0) & (offset < width)
    index = offset.clamp(0, width - 1)[None, None].expand(batch, k, capacity)
    sees = before | (tree.expand(batch, k, width).gather(2, index) & inside[None, None])
    mask = torch.zeros(sees.shape, dtype=dtype, device=seen.device)
    return mask.masked_fill_(~sees, torch.finfo(dtype).min)[:, None]


def compact(buffers: list[torch.Tensor], start: torch.Tensor, path: torch.Tensor) -> None:
    """Each row's accepted entries, at columns start + path (B, A), moved to start + arange(A) in
    every (B, heads, C, D) buffer (gathered first: a path's node ids are never below their slot,
    so the reads see the verify's entries)."""
    batch, width = path.shape
    columns = start + torch.arange(width, device=path.device)
    for buffer in buffers:
        index = (start + path)[:, None, :, None].expand(batch, buffer.shape[1], width, buffer.shape[3])
        buffer.index_copy_(2, columns, buffer.gather(2, index))


def _round_graph(model: torch.nn.Module, taps: dict[int, torch.Tensor], layer_ids: tuple[int, ...],
                 cache_kw: str, dtype: torch.dtype, parts: Any, plan: Any,
                 target: tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor],
                 lengths: torch.Tensor, root: torch.Tensor, head: Any, warp: SamplingConfig,
                 draws: torch.Tensor | None) -> Any:  # fmt: skip
    """The round that is compiled: every input explicit (see the module's note); `draws` (B, K)
    the round's uniforms under sampling, None when greedy."""
    from headstart.inference.captured import StaticKV
    from headstart.targets.layer_kinds import layer_masks

    keys, values, seen, length = target
    drawn = PreDrawn(draws) if draws is not None else None  # the draft's draws first, then acceptance's
    # the tree's own draft over the program's drafter
    tree = plan.draft(parts.drafter(head), root, warp, drawn)
    positions = lengths[:, None] + tree.depths
    mask = capacity_mask(seen, length, tree.visible, dtype)
    out = model(input_ids=tree.tokens, attention_mask=layer_masks(model, mask), position_ids=positions,
                **{cache_kw: StaticKV(keys, values, length)}, use_cache=True)  # fmt: skip
    if draws is None:
        acc = accept_greedy(tree, out.logits)
    else:
        acc = accept_sampling(tree, out.logits, warp, drawn)
    slot, real, committed = committed_path(acc, tree)
    compact(keys + values, length, acc.path)
    seen.index_copy_(1, length + slot[0], real)
    index = acc.path[..., None].expand(-1, -1, taps[-1].shape[-1])
    layers = {i: taps[i].gather(1, index) for i in layer_ids}
    head = parts.round_observe(taps[-1].gather(1, index), layers, committed, lengths[:, None] + slot, real,
                               acc.lengths - 1, head)  # fmt: skip
    length.add_(plan.path_width)  # the next round's first column (the host counts the same)
    report = torch.cat([acc.lengths[:, None], committed], 1)  # what the host reads: count, tokens
    return report, lengths + acc.lengths, acc.bonus, head


@functools.cache
def _compiled(backend: str, mode: str | None) -> Any:
    allow_graphs()
    return torch.compile(_round_graph, fullgraph=True, backend=backend, mode=mode, dynamic=False)


class CapturedRound:
    """One target's and drafter kind's round program for a fixed tree; the visibility buffers
    are kept for the decoder's lifetime (static addresses, as the KV buffers)."""

    def __init__(self, verify: Any, plan: Any, vocab: int, backend: str = "inductor",
                 mode: str | None = None) -> None:  # fmt: skip
        self.verify = verify  # the CapturedVerify whose KV buffers and feature taps this shares
        self.plan = plan  # the tree's RoundPlan (inference/trees/draft.py)
        self.vocab = vocab  # the drafter's logits' width (the target vocabulary): a sampled draft's noise
        self.fn = _compiled(backend, graph_mode(verify.model, mode))
        self._seen: dict[str, torch.Tensor] = {}  # the target's visibility buffer
        self.start = DeviceLength()  # the target cache's column count, as the program reads it
        self.rounds = 0  # rounds that ran as the program
        self.fallbacks = 0  # rounds handed back to the eager steps

    @property
    def path_width(self) -> int:
        return self.plan.path_width

    @property
    def draws(self) -> int:
        """Uniforms a sampled round takes a row: a static draft's Gumbel noise (V for each frontier
        node of each level), every level's sibling coin flips (at most depth * (n - 1)), then the
        bonus token's. cost: (B, K) floats a round (the default static tree on SmolLM2: ~1M)."""
        return self.plan.sampled * self.vocab + self.plan.depth * (self.plan.size - 1) + 1

    def reserve(self, new_tokens: int) -> int:
        """Target-cache columns a generation of `new_tokens` may append (A a round, the verify's
        n on top)."""
        return new_tokens * self.path_width + self.plan.size

    def run(self, state: Any, drafter: Any, dtype: torch.dtype, sampling: SamplingConfig = GREEDY,
            generator: Generator = None) -> torch.Tensor | None:  # fmt: skip
        """The round over `state` (inference/results.DecodeState) and `drafter`, advancing both;
        returns each row's count and committed tokens, (B, 1 + A) on the device (row b's first
        count real), or None (run the eager round: nothing was changed). `generator`: the
        batch's or its rows' (RowGenerators) sampling draws."""
        length = state.visible.shape[1]
        claimed = self.verify.buffers.claim(state.cache, length, self.plan.size, pad=False)
        inputs = getattr(drafter, "round_inputs", None)
        head_in = inputs(self.plan) if inputs is not None and claimed is not None else None
        if head_in is None or claimed is None:
            self.fallbacks += 1
            return None
        _, keys, values = claimed
        device = state.root.device
        seen = visibility_buffer(self._seen, state.visible, keys[0].shape[-2])
        start = self.start.at(length, device)
        rows = state.root.shape[0]
        # cost under sampling: one draw op a round (one a row with per-row generators)
        draws = None if sampling.greedy else uniform((rows, self.draws), generator, device)
        from headstart.targets.attention import grouped_query_attention

        with grouped_query_attention(self.verify.model) if device.type == "cpu" else contextlib.nullcontext():
            step_begins(device)
            report, lengths, root, head_out = own(
                self.fn(
                    self.verify.model,
                    self.verify.taps,
                    self.verify.feature_layers,
                    self.verify.cache_kw,
                    dtype,
                    head_in.parts,
                    self.plan,
                    (keys, values, seen, start),
                    state.lengths,
                    state.root,
                    head_in.tensors,
                    warp_of(sampling),
                    draws,
                )  # fmt: skip
            )
        width = length + self.path_width
        self.start.advanced(self.path_width)
        end_views(state.cache, width)
        state.visible = seen.narrow(1, 0, width)  # one view op (a [:, :w] index is two)
        state.lengths, state.root = lengths, root
        drafter.round_done(head_out, self.path_width)
        self.rounds += 1
        return report


def visibility_buffer(store: dict[str, torch.Tensor], current: torch.Tensor, capacity: int) -> torch.Tensor:
    """A (B, capacity) bool buffer kept in `store` whose first columns are `current` (B, P):
    as it is when `current` already is its view (the last round left it so), else copied in (a
    fresh buffer when the row count changed; static addresses on CUDA, as the KV buffers)."""
    buffer = store.get("seen")
    rows, length = current.shape
    if buffer is not None and buffer.shape == (rows, capacity) and current.data_ptr() == buffer.data_ptr() \
            and current.stride() == buffer.stride():  # fmt: skip
        return buffer
    if buffer is None or buffer.shape != (rows, capacity):
        buffer = torch.zeros(rows, capacity, dtype=torch.bool, device=current.device)
        if buffer.device.type == "cuda":
            torch._dynamo.mark_static_address(buffer)
        store["seen"] = buffer
    buffer[:, :length] = current
    return buffer


class DeviceLength:
    """A cache's column count as a 0-d device tensor that the round program advances in place,
    with its host mirror: no host-to-device copy or index op a round, a `fill_` only when eager
    steps moved the count in between (cost: one op then)."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.host: int | None = None

    def at(self, length: int, device: torch.device) -> torch.Tensor:
        if self.tensor is None or self.tensor.device != device:
            self.tensor = torch.zeros((), dtype=torch.long, device=device)
            if device.type == "cuda":
                torch._dynamo.mark_static_address(self.tensor)
            self.host = 0
        if self.host != length:
            self.tensor.fill_(length)
            self.host = length
        return self.tensor

    def advanced(self, width: int) -> None:
        """The program added `width` (what the host counts beside it)."""
        assert self.host is not None
        self.host += width

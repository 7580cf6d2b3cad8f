"""RETIRED from the package (2026-11-27): a benchmark reference for scripts/bench_batchers.py only.

Continuous batching: many prompts in flight through headstart's own forward, finished rows
refilled at once. It was the engine of `headstart distill` until 2026-11-26; distillation now runs
on the one decoding engine (headstart/inference/batcher.py's EngineBatcher, the engine of
`generate` and `serve`), which matched it on the CPU. It is kept here, outside the package, until
the engine is measured against it on a GPU, where this loop's throughput was tuned.

A decode step is ONE target forward over every live row (one new token each): on a CPU the
small-row kernel reads the weights once for up to 64 rows (targets/smallmm.py), on a GPU the batch
fills the device. Rows live in *slots*; the KV cache is one (B, kv_heads, S, D) tensor per layer
whose S columns are shared storage, not positions:

* every row has its own position ids (RoPE is applied before the cache, so a column's key already
  carries its position) and its own `valid` mask over the columns (B, S);
* newcomers are prefilled in groups of similar length (`prefill_tokens` padded tokens a forward),
  then each one's P entries are written into the last P columns of a free slot (dead columns of
  the row it replaces are masked out); the cache grows on the left only when P > S;
* the prefix a group's prompts share (a chat template's system turn) runs once, batch 1, and its
  entries are copied to every row: the prefill runs only the rest (`min_shared_prefix=0`: off);
* the cache grows by one column per step; when dead columns (finished rows' leftovers, prompts
  shorter than their slot) pass a quarter of the width, every row's live columns are gathered
  right-aligned into a narrower cache (cost: one copy of the cache, rare).

Replies are the target's: greedy rows take the argmax, sampled rows draw from the warped
distribution with their OWN generator (seeded per request), so a reply does not depend on which
other prompts shared its batch (up to float rounding in attention reductions, as any batching).
One host read per step (the new tokens, to check stops).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from headstart.inference.grouping import prefill_groups, prefill_overhead_tokens
from headstart.inference.prefix import SharedPrefix
from headstart.inference.requests import EngineStats, Reply, Request
from headstart.inference.sampling import probabilities
from headstart.targets import Target, forward, new_cache, tree_attention_mask


@dataclass
class _Slot:
    request: Request
    position: int  # position id of the next token fed (== tokens committed so far)
    tokens: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


class ContinuousBatcher:
    """Answer a stream of requests with at most `max_batch` in flight.

    `run(requests, on_reply)` calls `on_reply(request, reply)` as each finishes; it may return
    follow-up requests (a conversation's next turn), which go to the FRONT of the queue so that
    started conversations finish first. `admit_every`: refill only when this many slots are free
    (or nothing else is waiting), so the cost of a prefill call is shared by several newcomers.
    """

    def __init__(
        self,
        target: Target,
        max_batch: int = 32,
        admit_every: int = 4,
        compact_slack: float = 0.25,
        compact_min: int = 32,
        prefill_tokens: int = 2048,
        min_shared_prefix: int = 8,
        prefill_overhead: int | None = None,
    ) -> None:
        from headstart.targets.packing import PackedLinears

        if max_batch < 1:
            from headstart.errors import HeadstartError

            raise HeadstartError(f"batch size must be >= 1, got {max_batch}", "use --batch-size 32")
        self.target = target
        self.max_batch = max_batch
        self.admit_every = max(1, min(admit_every, max_batch))
        self.compact_slack = compact_slack
        self.prefill_tokens = prefill_tokens  # padded prompt tokens per prefill forward (memory, mask size)
        self.prefill_overhead = (
            prefill_overhead_tokens(target.device) if prefill_overhead is None else prefill_overhead
        )
        self.compact_min = compact_min  # dead columns tolerated whatever the width (copies are not free)
        self.stops = frozenset(target.eos_token_ids)
        self.stats = EngineStats()
        self.packer = PackedLinears.for_model(target.model)  # CPU fp32: the small-row kernel
        self.prefix = SharedPrefix(target, min_shared_prefix)  # min 0: every prompt runs whole

    # ---- the loop -----------------------------------------------------------------------------
    @torch.no_grad()
    def run(
        self,
        requests: Iterable[Request],
        on_reply: Callable[[Request, Reply], Iterable[Request] | None],
        progress: Callable[[EngineStats], None] | None = None,
    ) -> EngineStats:
        queue: deque[Request] = deque()
        source = iter(requests)
        slots: list[_Slot | None] = []
        cache: Any = None
        valid = torch.zeros(0, 0, dtype=torch.bool, device=self.target.device)  # (B, S)
        logits: torch.Tensor | None = None  # (B, V): next-token logits of every live slot

        def pull(count: int) -> None:
            while len(queue) < count:
                nxt = next(source, None)
                if nxt is None:
                    return
                queue.append(nxt)

        while True:
            free = [i for i, s in enumerate(slots) if s is None] + list(range(len(slots), self.max_batch))
            pull(len(free))
            live = len(slots) - slots.count(None)
            if queue and free and (len(free) >= self.admit_every or live == 0 or len(queue) < len(free)):
                cache, valid, logits = self._admit(queue, free, slots, cache, valid, logits)
            if all(s is None for s in slots):
                if not queue:
                    break
                continue
            tokens = self._choose(logits, slots)  # (B,)
            chosen = tokens.tolist()  # cost: the one host read per step
            for i, slot in enumerate(slots):
                if slot is None:
                    continue
                token = chosen[i]
                slot.tokens.append(token)
                ended = token in self.stops
                if ended or len(slot.tokens) >= slot.request.sampling.max_new_tokens:
                    ids = slot.tokens[:-1] if ended else slot.tokens
                    self.stats.replies += 1
                    self.stats.new_tokens += len(slot.tokens)
                    slots[i] = None
                    valid[i] = False  # its entries are dead: compaction drops them
                    follow = on_reply(slot.request, Reply(token_ids=ids, finished=ended))
                    queue.extendleft(reversed(list(follow or [])))
            if progress is not None:
                progress(self.stats)
            if all(s is None for s in slots):  # start the next wave with a fresh, small cache
                slots, cache, logits = [], None, None
                valid = valid[:0, :0]
                continue
            cache, valid, logits = self._step(tokens, slots, cache, valid)
        return self.stats

    # ---- steps --------------------------------------------------------------------------------
    def _choose(self, logits: torch.Tensor, slots: list[_Slot | None]) -> torch.Tensor:
        """Next token per slot: argmax for greedy rows, a draw from each sampled row's own generator."""
        tokens = logits.argmax(-1)
        for i, slot in enumerate(slots):
            if slot is not None and not slot.request.sampling.greedy:
                probs = probabilities(logits[i : i + 1], slot.request.sampling)
                tokens[i] = torch.multinomial(probs, 1, generator=slot.generator)[0, 0]
        return tokens

    def _step(
        self, tokens: torch.Tensor, slots: list[_Slot | None], cache: Any, valid: torch.Tensor
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Feed every slot its newest token (dead slots feed a harmless one, masked to themselves)."""
        from headstart.targets.packing import packed

        start = time.perf_counter()
        batch = len(slots)
        alive = torch.tensor([s is not None for s in slots], device=valid.device)
        positions = torch.tensor([[s.position if s else 0] for s in slots], device=valid.device)
        mask = tree_attention_mask(valid & alive[:, None], torch.ones(batch, 1, 1, dtype=torch.bool,
                                   device=valid.device), self.target.dtype)  # fmt: skip  # (B, 1, 1, S + 1)
        with packed([self.packer], batch):
            feats = forward(self.target.model, tokens[:, None], attention_mask=mask, position_ids=positions,
                            past_key_values=cache)  # fmt: skip
        valid = torch.cat([valid, alive[:, None]], dim=1)
        for slot in slots:
            if slot is not None:
                slot.position += 1
        self.stats.decode_steps += 1
        self.stats.row_steps += int(sum(s is not None for s in slots))
        cache, valid = self._maybe_compact(cache, valid, max(s.position for s in slots if s is not None))
        self.stats.decode_s += time.perf_counter() - start
        return cache, valid, feats.logits[:, -1]

    def _admit(
        self,
        queue: deque[Request],
        free: list[int],
        slots: list[_Slot | None],
        cache: Any,
        valid: torch.Tensor,
        logits: torch.Tensor | None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill waiting requests into free slots, `prefill_tokens` prompt tokens per forward."""
        start = time.perf_counter()
        # shortest first: a group is padded to its longest prompt
        take = sorted(
            (queue.popleft() for _ in range(min(len(free), len(queue)))), key=lambda r: len(r.prompt)
        )
        lengths = [len(r.prompt) for r in take]
        for group in prefill_groups(take, lengths, self.prefill_tokens, self.prefill_overhead):
            cache, valid, logits = self._prefill(group, free, slots, cache, valid, logits)
            free = free[len(group) :]
        self.stats.prefill_s += time.perf_counter() - start
        return cache, valid, logits

    def _prefill(
        self,
        group: list[Request],
        free: list[int],
        slots: list[_Slot | None],
        cache: Any,
        valid: torch.Tensor,
        logits: torch.Tensor | None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill `group` into `free` slots: the rows opening with a shared prefix in one forward
        that starts after it, the others (if any, first) in one of their own."""
        prefix = self.prefix.pick([r.prompt for r in group])
        n = len(prefix)
        opens = [bool(n) and len(r.prompt) > n and r.prompt[:n] == prefix for r in group]
        inside = [r for r, yes in zip(group, opens, strict=True) if yes]
        outside = [r for r, yes in zip(group, opens, strict=True) if not yes]
        if outside and inside:  # free slots in order: the appended ones must stay contiguous
            cache, valid, logits = self._prefill_rows(outside, free, 0, slots, cache, valid, logits)
            free = free[len(outside) :]
        return self._prefill_rows(inside or outside, free, n if inside else 0, slots, cache, valid, logits)

    def _prefill_rows(
        self,
        group: list[Request],
        free: list[int],
        shared: int,
        slots: list[_Slot | None],
        cache: Any,
        valid: torch.Tensor,
        logits: torch.Tensor | None,
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One target forward over `group`'s prompts after their first `shared` tokens (the kept
        prefix's), left-padded (the caller orders prompts by length, so padding stays small); each
        row's entries then go into a free slot."""
        device = self.target.device
        own = self.prefix.rows(shared, len(group))  # the shared prefix's entries, one per row
        tails = [r.prompt[shared:] for r in group]
        width = max(len(t) for t in tails)
        ids = torch.zeros(len(group), width, dtype=torch.long, device=device)
        mine = torch.zeros(len(group), width, dtype=torch.bool, device=device)
        for row, tail in enumerate(tails):
            ids[row, width - len(tail) :] = torch.tensor(tail, device=device)
            mine[row, width - len(tail) :] = True
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        sees = (causal[None] & mine[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        before = torch.ones(len(group), shared, dtype=torch.bool, device=device)  # the prefix: all seen
        mask = tree_attention_mask(before, sees, self.target.dtype)  # (G, 1, W, shared + W)
        positions = shared + (mine.long().cumsum(1) - 1).clamp_min(0)
        # Plain gemm: a prefill has many rows, and packing weights for a one-off row count would
        # copy them all (538 MB for SmolLM2), more than the matmul costs.
        feats = forward(self.target.model, ids, attention_mask=mask, position_ids=positions,
                        past_key_values=own, logits_to_keep=1)  # fmt: skip
        longest = max(len(r.prompt) for r in group)
        if cache is None:  # the first wave: an empty cache of the same layers, filled slot by slot
            cache = new_cache(self.target.model)
            for layer, src in zip(cache.layers, own.layers, strict=True):
                layer.lazy_initialization(src.keys, src.values)
        # Grow the cache and the logits ONCE for the whole group: growing them row by row as slots
        # are appended copied the whole cache per newcomer (quadratic in the batch; a third of a
        # 128-row CPU prefill went to zero-fills and copies).
        rows = max(len(slots), max(free[: len(group)]) + 1)
        cache, valid = _grow(cache, valid, own, rows, longest)
        if logits is None or logits.shape[0] < rows:
            grown = feats.logits.new_zeros(rows, feats.logits.shape[-1])
            if logits is not None:
                grown[: logits.shape[0]] = logits
            logits = grown
        for row, (request, slot_id) in enumerate(zip(group, free, strict=False)):
            generator = None
            if not request.sampling.greedy:
                generator = torch.Generator(device=device)
                generator.manual_seed(request.seed if request.seed is not None else int(torch.seed()))
            slot = _Slot(request, position=len(request.prompt), generator=generator)
            if slot_id >= len(slots):
                slots.append(slot)
            else:
                slots[slot_id] = slot
            cache, valid = _place(cache, valid, own, row, slot_id, len(request.prompt), len(slots), shared)
            logits[slot_id] = feats.logits[row, -1]
            self.stats.prompt_tokens += len(request.prompt)
            self.stats.prefix_reused += shared
        assert logits is not None
        return cache, valid, logits

    def _maybe_compact(self, cache: Any, valid: torch.Tensor, need: int) -> tuple[Any, torch.Tensor]:
        """`need`: the most entries a live row holds (its position: one entry per token fed)."""
        width = valid.shape[1]
        if width - need <= max(self.compact_min, self.compact_slack * width):
            return cache, valid
        self.stats.compactions += 1
        return _compact(cache, valid, need)


# ---- cache surgery (columns are storage; positions live in the keys) -----------------------------
def _layers(cache: Any) -> list[Any]:
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]


def _place(
    cache: Any,
    valid: torch.Tensor,
    own: Any,
    row: int,
    slot: int,
    length: int,
    batch: int,
    shared: int = 0,
) -> tuple[Any, torch.Tensor]:
    """Write row `row`'s `length` entries of `own` (a prefill's cache: its first `shared` columns,
    the prompts' shared prefix, then the row's left-padded rest) into row `slot` of `cache`,
    right-aligned; grow `cache` to `batch` rows and `length` columns if needed."""
    cache, valid = _grow(cache, valid, own, batch, length)
    new_width = valid.shape[1]
    tail = length - shared
    for layer, mine in zip(_layers(cache), _layers(own), strict=True):
        for name in ("keys", "values"):
            into, src = getattr(layer, name), getattr(mine, name)
            if shared:
                into[slot, :, new_width - length : new_width - tail] = src[row, :, :shared]
            into[slot, :, new_width - tail :] = src[row, :, -tail:]
    valid[slot] = False
    valid[slot, new_width - length :] = True
    return cache, valid


def _grow(cache: Any, valid: torch.Tensor, own: Any, batch: int, length: int) -> tuple[Any, torch.Tensor]:
    """At least `batch` rows and `length` columns (new columns on the left, new rows dead)."""
    rows, width = valid.shape
    new_rows, new_width = max(rows, batch), max(width, length)
    if (new_rows, new_width) == (rows, width):
        return cache, valid
    for layer, src in zip(_layers(cache), _layers(own), strict=True):  # cost: one copy of the cache
        for name in ("keys", "values"):
            old = getattr(layer, name)
            ref = getattr(src, name)
            grown = ref.new_zeros(new_rows, ref.shape[1], new_width, ref.shape[3])
            if old is not None and old.numel():
                grown[:rows, :, new_width - width :] = old
            setattr(layer, name, grown)
    grown_valid = valid.new_zeros(new_rows, new_width)
    grown_valid[:rows, new_width - width :] = valid
    return cache, grown_valid


def _compact(cache: Any, valid: torch.Tensor, width: int) -> tuple[Any, torch.Tensor]:
    """Gather every row's valid columns, in order, right-aligned into `width` columns."""
    columns = valid.shape[1]
    index = torch.arange(columns, device=valid.device).expand_as(valid)
    # valid columns sort last (stable, so their order is kept); take the last `width` of each row
    order = torch.where(valid, index + columns, index).argsort(dim=1, stable=True)[:, -width:]  # (B, W)
    new_valid = valid.gather(1, order)
    for layer in _layers(cache):
        gather = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        layer.keys = layer.keys.gather(2, gather)
        layer.values = layer.values.gather(2, gather)
    return cache, new_valid

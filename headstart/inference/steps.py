"""The speculative round's steps over a typed state, below the engine that runs them.

    prefill -> [draft -> verify -> accept -> commit] * -> done

* prefill: one target forward over the (left-padded) prompts; the first token comes from it.
* draft:   the heads draft a token tree under each row's root (static or dynamic tree).
* verify:  ONE target forward over every tree node: 4D tree mask, position_ids = length + depth,
           the target's KV cache (no forked modeling code).
* accept:  greedy / exact rejection sampling / typical (LOSSY) picks a path and a bonus token.
* commit:  keep only the accepted path's KV entries, feed its target features back to the head,
           advance the state; the round's one device-to-host read.

`Steps` holds what every round of one target, drafter and tree shares (the tree, the packed or
compiled forwards); it knows no batch: the rows' state (`DecodeState`), their sampling
generator and the loop live on the engine (inference/engine.py), which calls these steps top to
bottom, and `SpeculativeDecoder.generate` (inference/decoder.py) is the front that builds one.
The layers: steps < engine < decoder; nothing here calls up.
"""

from __future__ import annotations

from typing import Any

import torch

from headstart.inference import cache as kv
from headstart.inference.drafters import make_drafter
from headstart.inference.plain import SamplingConfig
from headstart.inference.prompts import PrefillAborted, Prompts, prefill_chunk
from headstart.inference.results import DecodeState
from headstart.inference.sampling import Generator, PreDrawn, probabilities, sample, uniform
from headstart.inference.trees import draft_static
from headstart.inference.trees.draft import DraftTree
from headstart.inference.trees.spec import TreeChoice, TreeSpec, choose_tree
from headstart.inference.trees.static import ROOT_ONLY
from headstart.inference.verify import (
    Acceptance,
    accept_greedy,
    accept_sampling,
    accept_typical,
    committed_path,
)
from headstart.targets import Features, Target, forward, new_cache, tree_attention_mask
from headstart.targets.exactness import check_no_processors, must_step_plainly, positions
from headstart.targets.layer_kinds import check_tree_verifiable
from headstart.targets.packing import PackedLinears, packed


class Steps:
    """The round's steps for one target, drafter and tree (SpeculativeDecoder adds `generate`).

    tree: a TreeChoice (`choose_tree`: a `--tree` value parsed once), a `--tree` string, a
    TreeBuffers, a DynamicTree or None (the default static tree).
    typical: use Medusa's typical acceptance when sampling. LOSSY: the output is then NOT
    distributed as the target's; stats carry a `lossy` label.
    """

    def __init__(
        self, target: Target, heads: Any, tree: str | TreeChoice | TreeSpec | None = None, typical: bool = False,
        compile: bool = False, compile_backend: str = "inductor",
    ) -> None:  # fmt: skip
        self.target = target
        self.heads = heads  # None: plain decoding (each tree is the root, plus any lookup branch)
        if heads is not None:
            check_no_processors(target.model)  # generate applies them; a tree verify does not
            heads.bind(target.model)
        probe = make_drafter(heads, target.vocab_size)
        self.max_depth = probe.max_depth
        self.feature_layers: tuple[int, ...] = tuple(probe.feature_layers)  # the target layers it reads
        # positions a verify must not straddle or pass (targets/exactness.py)
        self.positions = positions(target.model)
        self.tree = choose_tree(tree).resolve(self.max_depth, drafted=heads is not None)
        self.typical = typical
        self.round_probe: Any = None  # inference/rounds.py's per-round hook while it measures
        # fp32 on CPU: weights packed for the verify's row count (a verify over 8 nodes costs
        # ~1.3-1.5x a 1-token forward instead of ~2.1x); None elsewhere. See targets/packing.py.
        self.packed = PackedLinears.for_model(target.model)
        # --compile: the verify as a compiled graph over a fixed buffer (inference/captured.py)
        self.captured: Any = None
        self.captured_head: Any = None  # the drafter's steps, compiled too (drafters.compiled_steps)
        # the whole round as one program (greedy or sampled), for a tree drafted from the heads
        # alone (static, chain, dynamic) and a drafter with round parts
        # (inference/captured_round.py); None: the steps run one by one
        self.captured_round: Any = None
        if compile:
            from headstart.inference.captured import CapturedVerify
            from headstart.inference.drafters import compiled_steps

            self.captured = CapturedVerify(target.model, probe.feature_layers, backend=compile_backend)
            self.captured_head = compiled_steps(probe, heads, compile_backend)
            plan = self.tree.round_plan(target.device, self.max_depth)
            # (a drafter of a kind with round parts may still not run in it: early exit)
            if (
                plan is not None
                and hasattr(probe, "round_inputs")
                and getattr(probe, "runs_in_program", True)
            ):
                from headstart.inference.captured_round import CapturedRound

                self.captured_round = CapturedRound(
                    self.captured, plan, target.vocab_size, backend=compile_backend
                )

    def draft_width(self) -> int:
        """The most nodes one step drafts into an EAGLE head's cache (a dynamic tree's whole
        pool, before the cut), plus the verify's margin."""
        extra = int(getattr(self.heads, "draft_slots", 0))  # positions a draft adds beyond the tree
        return self.tree.draft_nodes(self.max_depth, 0) + self.verify_width() + extra

    def must_step_plainly(self, lengths: list[int]) -> bool:
        """A plain step (the root alone) where a verify of this tree at these row lengths could
        pass a learned position table or straddle longrope's switch."""
        return must_step_plainly(self.positions, lengths, self.verify_width())

    def verify_width(self) -> int:
        """The most tree nodes one verify appends to the cache (the preallocation's margin)."""
        return self.tree.verify_bound()

    # ---- steps -------------------------------------------------------------------------------
    def prefill(self, prompts: Prompts, sampling: SamplingConfig, drafter: Any,
                prefix: tuple[Any, int] | None = None, abort: Any = None,
                generator: Generator = None) -> DecodeState:  # fmt: skip
        """`prefix`: (a SharedPrefix, n) whose first n tokens every prompt opens with and `prompts`
        holds the rest of: the cache starts with its entries per row and the forward runs only
        the rest; the drafter observes the whole prompt, the prefix's features from its kept
        ones (uncaptured: a captured verify adopts a cache of its own making). `abort`: asked
        between chunks of a long prompt (a server: every client left, or the grace period ran
        out); True raises PrefillAborted. `generator`: the batch's (or its rows') sampling draws."""
        model = self.target.model
        ids, valid = prompts.ids, prompts.valid  # (B, T): after the prefix, left-padded
        steps = ids.shape[1]
        shared = prefix[1] if prefix is not None else 0
        if shared and self.captured is not None:
            raise ValueError("a shared prefix is for uncaptured decoding")
        if shared and not set(drafter.feature_layers) <= set(prefix[0].layers):  # type: ignore[index]
            raise ValueError("the shared prefix did not keep the layers this drafter reads")
        before = valid.new_ones(ids.shape[0], shared)  # the prefix: every row sees it
        positions = (torch.cat([before, valid], 1).long().cumsum(1) - 1).clamp_min(0)[:, shared:]
        mask = None  # rows of one length: transformers' causal masks, sdpa's is_causal fast path
        if shared or not prompts.unpadded:  # padding (here after the prefix) hides by a 4D mask
            causal = torch.ones(steps, steps, dtype=torch.bool, device=ids.device).tril()
            sees = (causal[None] & valid[:, None, :]) | torch.eye(steps, dtype=torch.bool, device=ids.device)
            mask = tree_attention_mask(before, sees, self.target.dtype)  # (B, 1, T, shared + T)
        check_tree_verifiable(model)  # one line for recurrent/linear/chunked layers
        new = self._new_columns(sampling)
        reserve = shared + steps + new + self.verify_width()
        if shared:
            assert prefix is not None
            cache = prefix[0].rows(shared, ids.shape[0], reserve=reserve)
        else:
            cache = new_cache(model, reserve=reserve)
        if self.captured is not None:
            self.captured.adopt(cache)
        if self.captured_head is not None:
            drafter.capture(self.captured_head, steps + new + self.draft_width())
        kv.check_tree_compatible(cache)
        if abort is not None and steps > prefill_chunk(ids.device):
            feats = self._chunked_prefill(ids, valid, before, positions, cache, drafter.feature_layers, abort)
        else:
            feats = forward(model, ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            layers=drafter.feature_layers, logits_to_keep=1)  # fmt: skip
        root = self._choose(feats.logits[:, -1], sampling, generator)  # (B,)
        visible = torch.cat([before, valid], 1)
        seen = valid  # the positions the drafter observes
        if shared and self.heads is not None:  # a drafter reads the prefix's positions too
            assert prefix is not None
            feats, ids, positions = _after_prefix(prefix[0], shared, feats, ids, positions)
            seen = visible
        next_tokens = torch.cat([ids[:, 1:], root[:, None]], 1)
        if seen is visible:  # padding sits between the prefix and each row's rest: the prefix's
            lead = shared + steps - valid.sum(1)  # last token is followed by the row's first own one
            next_tokens[:, shared - 1] = ids.gather(1, lead[:, None])[:, 0]
        last = torch.full_like(root, ids.shape[1] - 1)
        if hasattr(drafter, "start"):  # a drafter reading tokens (a draft model): the one token
            # that never comes as a next token, each row's first (the prefix's, or after padding)
            first = ids[:, 0] if seen is visible else ids.gather(1, (steps - valid.sum(1))[:, None])[:, 0]
            drafter.start(first)
        drafter.observe(feats.last_hidden, feats.layers, next_tokens, positions, seen, last)
        return DecodeState(cache, visible, visible.sum(1), root, list(range(ids.shape[0])))

    def _chunked_prefill(self, ids: torch.Tensor, valid: torch.Tensor, before: torch.Tensor,
                         positions: torch.Tensor, cache: Any, layers: tuple[int, ...], abort: Any) -> Features:  # fmt: skip
        """The prefill's forward in chunks of `prefill_chunk` prompt tokens over the growing cache,
        `abort()` asked before each: a prompt of 600 tokens held a CPU core 4-7 s after its client
        had left, and a server's --grace waited on it. Each chunk sees the cache (the prefix, the
        earlier chunks) and itself causally, padding hidden, as one forward would."""
        steps, size = ids.shape[1], prefill_chunk(ids.device)
        parts = []
        for start in range(0, steps, size):
            if abort():
                raise PrefillAborted
            end = min(start + size, steps)
            n = end - start
            causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
            eye = torch.eye(n, dtype=torch.bool, device=ids.device)
            sees = (causal[None] & valid[:, None, start:end]) | eye
            mask = tree_attention_mask(torch.cat([before, valid[:, :start]], 1), sees, self.target.dtype)
            parts.append(forward(self.target.model, ids[:, start:end], attention_mask=mask,
                                 position_ids=positions[:, start:end], past_key_values=cache, layers=layers,
                                 logits_to_keep=1))  # fmt: skip
        return Features(
            logits=parts[-1].logits,
            last_hidden=torch.cat([part.last_hidden for part in parts], 1),
            layers={i: torch.cat([part.layers[i] for part in parts], 1) for i in parts[0].layers},
        )

    def _new_columns(self, sampling: SamplingConfig) -> int:
        """Cache columns a generation appends after its prompt: one a token, or, where the
        round program may run, its path width a round (inference/captured_round.py's cost)."""
        if self.program_for(sampling):
            return self.captured_round.reserve(sampling.max_new_tokens)
        return sampling.max_new_tokens

    def program_for(self, sampling: SamplingConfig) -> bool:
        """Whether rounds under `sampling` may run as the round program (not typical acceptance:
        it is lossy and stays in the steps)."""
        return self.captured_round is not None and (sampling.greedy or not self.typical)

    def round(self, state: DecodeState, sampling: SamplingConfig, drafter: Any,
              generator: Generator = None) -> tuple[list[list[int]], list[int]] | None:  # fmt: skip
        """The whole round as one program (draft, verify, accept, commit), then its one read:
        each row's committed tokens and count, as `commit` returns them; None where the program
        cannot run (no round program, typical acceptance, the caches not in its buffers or full:
        the caller runs the steps). `generator`: the batch's or its rows' sampling draws."""
        report = self.round_unread(state, sampling, drafter, generator)
        if report is None:
            return None
        return unpack_report(self._read_step(report))  # host sync: the round's one read

    def program_draws(self, rows: int, sampling: SamplingConfig, generator: Generator) -> Generator:
        """What the eager steps draw from in a round the program could have run but did not (the
        batch changed, its caches left the buffers): under sampling, the program's own (B, K)
        draw, pre-drawn, taken by the steps in the program's order, so a seeded row's reply does
        not depend on which rounds ran as the program (a server's rows join and leave beside
        it); else `generator`."""
        if sampling.greedy or not self.program_for(sampling):
            return generator
        return PreDrawn(uniform((rows, self.captured_round.draws), generator, self.target.device))

    def round_unread(self, state: DecodeState, sampling: SamplingConfig, drafter: Any,
                     generator: Generator = None) -> torch.Tensor | None:  # fmt: skip
        """`round` without the read: the report (B, 1 + A), each row's count then its tokens, on
        the device, for the engine to read after it queued the next round (the host knows the
        round's widths: the program advances both caches by A)."""
        if not self.program_for(sampling):
            return None
        return self.captured_round.run(state, drafter, self.target.dtype, sampling, generator)

    def draft(self, state: DecodeState, sampling: SamplingConfig, drafter: Any,
              contexts: list[list[int]] | None = None, plain: bool = False,
              generator: Generator = None) -> DraftTree:  # fmt: skip
        """The heads' tree; with a lookup branch, plus the tokens that followed the latest earlier
        match of each row's context (`contexts`: committed tokens per live row, root last).
        `plain`: the root alone (a plain step: what it commits is still observed, by `commit`'s
        observer: the drafter, or the engine's pending observations until it next drafts)."""
        if plain:
            return draft_static(ROOT_ONLY, drafter, state.root, sampling, generator)
        if hasattr(drafter, "before_draft"):  # a drafter over the target's own cache (early exit) reads it
            drafter.before_draft(state)
        return self.tree.draft(drafter, state.root, sampling, generator, self.max_depth, contexts)

    def verify(self, state: DecodeState, tree: DraftTree, drafter: Any) -> Features:
        positions = state.lengths[:, None] + tree.depths  # (B, n)
        if self.captured is not None:
            feats = self.captured.verify(state.cache, state.visible, tree.tokens, positions, tree.visible,
                                         self.target.dtype)  # fmt: skip
            if feats is not None:
                return feats
        mask = tree_attention_mask(state.visible, tree.visible, self.target.dtype)  # (B, 1, n, P + n)
        with packed([self.packed], tree.tokens.numel()):
            return forward(self.target.model, tree.tokens, attention_mask=mask, position_ids=positions,
                           past_key_values=state.cache, layers=drafter.feature_layers)  # fmt: skip

    def accept(self, tree: DraftTree, feats: Features, sampling: SamplingConfig,
               generator: Generator = None) -> Acceptance:  # fmt: skip
        if sampling.greedy:
            return accept_greedy(tree, feats.logits)
        if self.typical:
            return accept_typical(tree, feats.logits, sampling, generator=generator)
        return accept_sampling(tree, feats.logits, sampling, generator)

    def commit(
        self, state: DecodeState, tree: DraftTree, feats: Features, acc: Acceptance, drafter: Any
    ) -> tuple[list[list[int]], list[int]]:
        """Compact the KV cache to the accepted path, feed the head, advance the state.

        Returns each live row's committed tokens and its count (row b's first counts[b] are
        real), read back in the step's ONE device-to-host transfer; everything before it has
        static shapes (acc.path is padded to the tree's depth + 1), and the width it reads back
        trims the cache and the head's inputs to the longest accepted path."""
        slot, real, committed = committed_path(acc, tree)
        in_place = ((acc.path == slot) | ~real).all(1)
        # host sync: the one device-to-host read of the step (lengths, in-place flags, tokens)
        host = self._read_step(torch.cat([acc.lengths[:, None], in_place[:, None].long(), committed], 1))
        counts = [row[0] for row in host]
        marks = (slot, real, committed)
        self._advance(state, tree, feats, acc, drafter, marks, max(counts), all(row[1] for row in host))
        return [row[2 : 2 + count] for row, count in zip(host, counts, strict=True)], counts

    def commit_unread(self, state: DecodeState, tree: DraftTree, feats: Features, acc: Acceptance,
                      drafter: Any) -> torch.Tensor:  # fmt: skip
        """`commit` for a root-only tree (a plain step), without the read: each row commits one
        token whose entry is already in place, so the host knows every width; the tokens, (B, 1),
        stay on the device for the engine to read one step later (inference/engine.py, `Unread`)."""
        if tree.size != 1:
            raise ValueError("commit_unread is for root-only trees: a drafted tree's widths need the read")
        self._advance(state, tree, feats, acc, drafter, committed_path(acc, tree), 1, True)
        return acc.bonus[:, None]

    @staticmethod
    def _advance(state: DecodeState, tree: DraftTree, feats: Features, acc: Acceptance, drafter: Any,
                 marks: tuple[torch.Tensor, torch.Tensor, torch.Tensor], width: int, in_place: bool) -> None:  # fmt: skip
        """The commit after its read: the cache kept to each row's path (`width`: the longest,
        `in_place`: every row's already where it belongs), the drafter's observation, the state.
        `marks`: `committed_path`'s slots, real flags and tokens."""
        prefix = kv.cache_length(state.cache) - tree.size
        slot, real, committed = marks
        kv.keep_entries(state.cache, prefix, acc.path[:, :width], in_place=in_place)
        path, real, committed = acc.path[:, :width], real[:, :width], committed[:, :width]
        index = path[..., None].expand(-1, -1, feats.last_hidden.shape[-1])
        layers = {i: x.gather(1, index) for i, x in feats.layers.items()}
        positions = state.lengths[:, None] + slot[:, :width]
        drafter.observe(
            feats.last_hidden.gather(1, index), layers, committed, positions, real, acc.lengths - 1
        )
        state.visible = torch.cat([state.visible, real], dim=1)
        state.lengths = state.lengths + acc.lengths
        state.root = acc.bonus

    @staticmethod
    def _read_step(values: torch.Tensor) -> list[list[int]]:
        """The step's one device-to-host read (tests/inference/test_host_syncs.py allows only it)."""
        return values.tolist()

    # ---- helpers of the steps --------------------------------------------------------------------
    def _tree_depth(self) -> int | None:
        """How many levels the tree drafts (a dynamic tree: its depth, cut to the heads')."""
        return self.tree.levels(self.max_depth)

    @property
    def verify_nodes(self) -> int:
        """Tree nodes in one row's verify forward (root and any lookup branch included)."""
        return self.tree.verify_nodes(self.max_depth)

    @staticmethod
    def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator: Generator) -> torch.Tensor:
        if sampling.greedy:
            return logits.argmax(-1)
        return sample(probabilities(logits, sampling), generator)


def unpack_report(host: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """A round program's report read back, (B, 1 + A) rows of count then tokens -> each row's
    committed tokens and count, as `commit` returns them."""
    return [row[1 : 1 + row[0]] for row in host], [row[0] for row in host]


def _after_prefix(prefix: Any, shared: int, feats: Features, ids: torch.Tensor,
                  positions: torch.Tensor) -> tuple[Features, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The rest's features, ids and positions (B, T) behind the kept prefix's first `shared`
    (B, shared + T): what a drafter observes when the whole prompt was prefilled."""
    rows = ids.shape[0]

    def widen(kept: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        return torch.cat([kept[:, :shared].expand(rows, *[-1] * (kept.dim() - 1)), rest], 1)

    kept = prefix.features
    layers = {i: widen(kept.layers[i], x) for i, x in feats.layers.items()}
    whole = Features(
        logits=feats.logits, last_hidden=widen(kept.last_hidden, feats.last_hidden), layers=layers
    )
    head = torch.tensor([prefix.ids[:shared]], dtype=ids.dtype, device=ids.device)
    start = torch.arange(shared, device=positions.device)[None].expand(rows, -1)
    return whole, widen(head, ids), torch.cat([start, positions], 1)

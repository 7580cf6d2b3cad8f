"""A prompt prefix many requests share, prefilled once and copied to each row.

Chat prompts start with the same template text (SmolLM2: a 22-token system turn, ~28% of a
ShareGPT first turn), and a prefill's cost is its tokens: the prefix runs once (batch 1) and its
cache entries are copied to every row of a group, whose prefill then runs only the rest. Its
entries come from a batch-1 forward rather than each row's own, so they may differ in the last
float bits (as batching does). Used by distillation's continuous batcher and by the engine's
admissions (`headstart serve` keeps one across requests). With draft heads the target layers
they read are kept over the prefix too: the drafter still observes every position of the prompt
(its own pass over the prefix is per row, and cheap: one draft layer against the target's all).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from headstart.targets import forward, new_cache, tree_attention_mask


class SharedPrefix:
    """The prefix last run and its batch-1 cache, kept while later prompts share it."""

    def __init__(self, target: Any, min_tokens: int = 8, layers: tuple[int, ...] = ()) -> None:
        self.target = target
        self.min_tokens = min_tokens  # 0 = never share
        # the target layers a draft head reads: their outputs over the prefix are kept too, so a
        # drafter observes the whole prompt while the target runs only the rest
        self.layers = tuple(layers)
        self.ids: list[int] = []
        self.cache: Any = None
        self.features: Any = None  # targets/features.py's Features over `ids` (batch 1)
        self.recent: list[int] | None = None  # the last prompt asked about: a lone newcomer's witness

    def pick(self, prompts: list[list[int]]) -> list[int]:
        """The prefix most of `prompts` open with (at least `min_tokens` tokens, shorter than each
        member), [] for none. The kept prefix's first n entries serve any prompt opening with its
        first n tokens, so it is reused (in part) unless the prompts share more among themselves;
        a new one is run when two prompts share it, the previous call's last prompt counting as
        one (a server admitting one request at a time learns its chat template's opening)."""
        m = self.min_tokens
        recent, self.recent = self.recent, (prompts[-1] if prompts else self.recent)
        heads = Counter(tuple(p[:m]) for p in prompts if m and len(p) > m)
        if not heads:
            return []
        head, _ = heads.most_common(1)[0]
        members = [p for p in prompts if len(p) > m and tuple(p[:m]) == head]
        witnesses = members + ([recent] if recent is not None and tuple(recent[:m]) == head else [])
        limit = min(len(p) for p in members) - 1  # every member keeps a token of its own to prefill
        own = min(common_prefix(witnesses), limit) if len(witnesses) > 1 else 0
        kept = self.ids
        if len(kept) >= m and tuple(kept[:m]) == head:
            reuse = min(common_prefix([*members, kept]), limit)
            if reuse >= own:
                return kept[:reuse]
        if own < m:
            return []
        ids = list(members[0][:own])
        # a new prefix that extends the kept one (a chat's next turn opens with the last turn's
        # prompt) runs only its extension: the kept entries are copied
        start = min(common_prefix([ids, kept]), len(ids) - 1) if len(kept) >= m else 0
        cache, features = self._run(ids, start if start >= m else 0)  # first: a failing forward keeps the old
        self.ids, self.cache, self.features = ids, cache, features
        return self.ids

    def rows(self, shared: int, rows: int, reserve: int = 0) -> Any:
        """A fresh cache holding the kept prefix's first `shared` entries once per row."""
        own = new_cache(self.target.model, reserve=reserve)
        if not shared:
            return own
        for layer, src in zip(own.layers, self.cache.layers, strict=True):
            if getattr(src, "keys", None) is None:
                continue
            layer.lazy_initialization(src.keys, src.values)
            # a view with stride 0 over the rows: the forward's append makes the real copy
            layer.keys = src.keys[:, :, :shared].expand(rows, -1, -1, -1)
            layer.values = src.values[:, :, :shared].expand(rows, -1, -1, -1)
        return own

    def _run(self, ids: list[int], start: int = 0) -> tuple[Any, Any]:
        """The target's cache after `ids` alone (batch 1, causal) and its features there; the kept
        prefix's first `start` entries (equal to `ids[:start]`) are copied, not run again."""
        device = self.target.device
        n = len(ids) - start
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask = tree_attention_mask(
            causal.new_ones(1, start), causal, self.target.dtype
        )  # (1, 1, n, start + n)
        cache = self.rows(start, 1) if start else new_cache(self.target.model)
        features = forward(self.target.model, torch.tensor([ids[start:]], device=device), attention_mask=mask,
                           position_ids=torch.arange(start, len(ids), device=device)[None], past_key_values=cache,
                           layers=self.layers, logits_to_keep=1)  # fmt: skip
        if start:  # the kept features first: the drafter reads every position of the prefix
            kept = self.features
            features.last_hidden = torch.cat([kept.last_hidden[:, :start], features.last_hidden], 1)
            features.layers = {
                i: torch.cat([kept.layers[i][:, :start], x], 1) for i, x in features.layers.items()
            }
        return cache, features


def common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest prefix all `prompts` share."""
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return n

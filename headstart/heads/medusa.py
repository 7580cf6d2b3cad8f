"""Medusa heads: K heads of residual blocks over the target's last hidden state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headstart.errors import HeadstartError
from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import MAX_BLOCKS, SHAPE, HeadConfig
from headstart.heads.vocab import DraftVocab
from headstart.targets.smallmm import linear


@dataclass
class MedusaOptions:
    """Medusa's own `head.*` keys (HeadSpec.options for head.kind=medusa)."""

    num_heads: int = 3
    """Number of heads K; head k predicts the token k+1 positions after the target's next token."""
    shared_lm_head: bool = True
    """Reuse the target's (frozen) lm_head instead of a trainable copy per head."""

    def __post_init__(self) -> None:
        if self.num_heads < 1:
            raise HeadstartError(f"head.num_heads must be >= 1, got {self.num_heads}", "set head.num_heads=3")


@dataclass
class MedusaConfig:
    """Medusa's own fields of a checkpoint's config.json (HeadConfig.options for kind medusa)."""

    num_heads: int = field(default=1, metadata=SHAPE)
    shared_lm_head: bool = field(default=True, metadata=SHAPE)

    def __post_init__(self) -> None:
        # checked before modules are built from it: a damaged file must not build a million heads
        if not 1 <= self.num_heads <= MAX_BLOCKS:
            raise HeadstartError(
                f"num_heads is {self.num_heads}: Medusa heads number 1 to {MAX_BLOCKS}",
                "restore the file from the run that wrote it",
            )

    def card(self) -> str:
        """Its part of the model card's head line."""
        return f"heads {self.num_heads}"


class ResBlock(nn.Module):
    """`x + SiLU(Linear(x))`, zero-initialised so a fresh head starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(DraftVocab, HeadCheckpoint, nn.Module):
    """K heads; head k (1-based) reads f_t and predicts x_{t+1+k} (see headstart.heads.base).

    The vocabulary projection is either one trainable copy per head (initialised from the target's
    lm_head when built with `headstart.heads.build_head`) or the target's own lm_head, bound and
    frozen and never saved (`shared_lm_head`).

    With a draft vocabulary (draft_vocab_size < vocab) training still scores the full vocabulary;
    drafting (`draft_logits`) projects onto the Vd draft rows only: a Medusa step reads K heads'
    states through the V x H lm_head, 113 MB on SmolLM2, the largest cost of a CPU draft step.
    """

    kind = "medusa"
    feature_layers: tuple[int, ...] = ()

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        """A recipe's `head:` as this kind's HeadConfig fields (headstart.heads.build.head_config)."""
        return {
            "num_heads": spec.num_heads,
            "num_layers": spec.num_layers,
            "shared_lm_head": spec.shared_lm_head,
        }

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        hidden, vocab = config.hidden_size, config.vocab_size
        # A fresh module per block and per head: `[ResBlock()] * n` would share weights.
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        self.lm_heads = (
            None
            if config.shared_lm_head
            else nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(config.num_heads))
        )
        self._bound: dict[str, nn.Module] = {}
        self.init_draft_vocab(config.draft_vocab_size, vocab, always=False)
        self._rows: dict[int, tuple[tuple[int, int, int], torch.Tensor]] = {}  # head -> (key, Vd x H rows)

    @property
    def has_draft_vocab(self) -> bool:
        return self.draft_vocab_size < self.config.vocab_size

    def bind(self, target_model: Any) -> None:
        """Keep a frozen reference to the target's lm_head (used when shared; not saved)."""
        self._bound["lm_head"] = target_model.get_output_embeddings()

    def init_from_target(self, target_model: Any) -> None:
        """Copy the target's lm_head into each own projection (the Medusa reference's init)."""
        if self.lm_heads is not None:
            weight = target_model.get_output_embeddings().weight
            with torch.no_grad():
                for proj in self.lm_heads:
                    proj.weight.copy_(weight)

    def linears_not_called(self) -> list[nn.Module]:
        """Own projections read only as draft-vocabulary row subsets (`draft_logits`), never called
        as modules: the CPU kernel keeps no bf16 rows of them (gguf_blocks.attach_bf16)."""
        return list(self.lm_heads) if self.lm_heads is not None and self.has_draft_vocab else []

    def projection(self, k: int) -> nn.Module:
        if self.lm_heads is not None:
            return self.lm_heads[k]
        if "lm_head" not in self._bound:
            from headstart.errors import HeadstartError

            raise HeadstartError(
                "Medusa heads with a shared lm_head are not bound to a target",
                "call heads.bind(target.model)",
            )
        return self._bound["lm_head"]

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k alone: hidden (..., H) -> logits (..., V)."""
        return self.projection(k)(self.heads[k](hidden))

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """hidden (B, T, H) -> logits (K, B, T, V) of the first `count` heads (default all).
        Memory: K * B * T * V floats. With the shared lm_head the K heads' states go through it
        in ONE matmul: it reads the V x H matrix once, not K times (the cost of a decode step on
        a CPU, where that matrix is 113 MB for SmolLM2)."""
        count = self.num_heads if count is None else min(count, self.num_heads)
        if self.lm_heads is not None:
            return torch.stack([self.head_logits(k, hidden) for k in range(count)])
        states = torch.stack([self.heads[k](hidden) for k in range(count)])  # (K, B, T, H)
        return self.projection(0)(states)

    def draft_logits(
        self, hidden: torch.Tensor, count: int | None = None, rows: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """`forward` over the draft vocabulary: logits (K, B, T, Vd) (draft ids; `draft_to_target`
        maps them). Without a draft vocabulary this is `forward`. `rows`: `draft_rows(count)`,
        computed by the caller (a compiled graph cannot run the Python cache behind it)."""
        if not self.has_draft_vocab:
            return self(hidden, count)
        count = self.num_heads if count is None else min(count, self.num_heads)
        rows = self.draft_rows(count) if rows is None else rows
        states = torch.stack([self.heads[k](hidden) for k in range(count)])  # (K, B, T, H)
        # the rows are no module's weight: the CPU kernel by hand (F.linear cost ~1 ms a step
        # for SmolLM2's 8192 rows; smallmm.linear falls back to it under autograd or compile)
        if self.lm_heads is None:  # one matmul through the shared rows
            return linear(states, rows[0])
        return torch.stack([linear(states[k], rows[k]) for k in range(count)])

    def draft_rows(self, count: int) -> list[torch.Tensor]:
        """The projections' draft-vocabulary rows the first `count` heads use (one shared)."""
        return [self._draft_rows(k) for k in range(1 if self.lm_heads is None else count)]

    def _draft_rows(self, k: int) -> torch.Tensor:
        """Head k's projection restricted to the draft vocabulary, (Vd, H); cached until the
        weight changes (cost: one Vd x H gather)."""
        proj = self.projection(k)
        weight = proj.weight
        key = (weight.data_ptr(), weight._version, self.d2t._version)  # type: ignore[union-attr]
        slot = 0 if self.lm_heads is None else k
        cached = self._rows.get(slot)
        if cached is None or cached[0] != key:
            with torch.no_grad():
                rows = weight[self.draft_ids().to(weight.device)]
            self._rows[slot] = (key, rows)
        return self._rows[slot][1]

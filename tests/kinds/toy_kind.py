"""A toy head kind, written as a new kind's author would (docs/developer/add-a-head-kind.md): a
head module, a drafter, a training objective, all in this one new file; the test registers it
with one line. The head: one residual block on the target's last hidden state, projected by the
target's own lm_head, drafting one token (a one-head Medusa). Its own `head.*` and `loss.*` keys and
its own fields of a checkpoint's config.json live here too (ToyOptions, ToyLoss, ToyConfig), named
by the same registration line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headstart.heads.checkpoint import HeadCheckpoint
from headstart.heads.config import SHAPE, HeadConfig

USED: dict[str, float] = {}  # what the last training read from the kind's own keys (the test looks)


@dataclass
class ToyOptions:
    """The toy's own `head.*` key (its head section)."""

    init_std: float = 0.0
    """The block's weights start at N(0, init_std) for training (0: zeros, the identity)."""
    bias: bool = True
    """The block has a bias."""


@dataclass
class ToyConfig:
    """The toy's own field of a checkpoint's config.json (its config section): the head's
    modules are built from it, so a warm start must match it (SHAPE)."""

    bias: bool = field(default=True, metadata=SHAPE)


@dataclass
class ToyLoss:
    """The toy's own `loss.*` key (its loss section)."""

    label_smoothing: float = 0.0
    """Label smoothing of the toy's cross-entropy."""


class ToyHead(HeadCheckpoint, nn.Module):
    kind = "toy"
    feature_layers: tuple[int, ...] = ()

    @staticmethod
    def spec_fields(spec: Any, target: Any) -> dict[str, Any]:
        return {"bias": spec.bias}

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.block = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        nn.init.zeros_(self.block.weight)
        if config.bias:
            nn.init.zeros_(self.block.bias)
        self._bound: dict[str, nn.Module] = {}

    def before_training(self, spec: Any) -> None:
        USED["init_std"] = spec.init_std
        if spec.init_std:
            with torch.no_grad():
                self.block.weight.normal_(0, spec.init_std)

    def bind(self, target_model: Any) -> None:
        self._bound["lm_head"] = target_model.get_output_embeddings()

    def init_from_target(self, target_model: Any) -> None:
        pass

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, H) -> logits (B, T, V) of the token after the target's next one."""
        return self._bound["lm_head"](hidden + torch.nn.functional.silu(self.block(hidden)))


class ToyDrafter:
    """The decoder's view: one drafted level, from the last committed feature."""

    max_depth = 1

    def __init__(self, heads: ToyHead, vocab_size: int, depth: int | None = None) -> None:
        self.heads = heads
        self.feature_layers: tuple[int, ...] = ()
        self.logits: torch.Tensor | None = None  # (B, V)

    @torch.no_grad()
    def observe(self, last_hidden, layers, next_tokens, positions, valid, last) -> None:
        rows = torch.arange(last_hidden.shape[0], device=last.device)
        self.logits = self.heads(last_hidden[rows, last][:, None])[:, 0]

    def root_logits(self) -> torch.Tensor:
        return self.logits

    def expand(self, nodes, parents, tokens, depth, visible) -> torch.Tensor:
        raise AssertionError("the toy drafts one level")

    def end_step(self) -> None:
        pass

    def select_rows(self, rows: torch.Tensor) -> None:
        self.logits = self.logits[rows]

    def merge(self, other: ToyDrafter) -> None:
        self.logits = torch.cat([self.logits, other.logits])


def toy_loss(
    objective: Any, feats: Any, batch: dict[str, torch.Tensor], evaluate: bool, joint: bool = False
) -> dict:
    """The kind's training objective: CE of the token two ahead (x_{t+2}) from the target's last
    hidden state at t, with held-out hit counts when evaluating."""
    from headstart.train import losses

    ids, mask = batch["input_ids"], batch["loss_mask"]
    logits = objective.head(feats.last_hidden)  # (B, T, V)
    scored = losses.ahead(mask, 2).bool()
    smoothing = USED["label_smoothing"] = objective.cfg.loss.label_smoothing
    loss = torch.nn.functional.cross_entropy(
        logits[scored], losses.ahead(ids, 2)[scored], label_smoothing=smoothing
    )
    out = {"loss": loss, "parts": loss.detach()[None]}
    if evaluate:
        top = logits.topk(objective.cfg.topk, dim=-1).indices  # (B, T, k)
        out["hits"] = losses.draft_hits([top], feats.logits.argmax(-1), mask)
    return out


toy_loss.parts = lambda cfg: ["ce"]

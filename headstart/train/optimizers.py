"""The head's optimizer: AdamW, or Muon on the hidden matrices with AdamW on the rest.

Muon (Jordan et al. 2024; torch.optim.Muon, in torch since 2.9) orthogonalises each 2-D update
with a few Newton-Schulz steps, and is meant for the hidden layers' matrices only: embeddings,
the output projection (lm_head) and every 1-D parameter (norms, biases) stay on AdamW, as its
authors, Moonshot's Muon-is-scalable and speculators (its default since PR #746) split them.
`adjust_lr_fn="match_rms_adamw"` scales Muon's rate by 0.2 * sqrt(max(rows, cols)), so that one
`optim.lr` suits both halves (Moonshot); `optim.muon_lr` sets Muon's apart. cost: five
Newton-Schulz iterations (three matmuls each) per matrix per step, ~1% of an EAGLE-3 step here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

ADAMW_ONLY = ("lm_head", "embed")  # names that stay on AdamW whatever their shape


def muon_split(named: Iterable[tuple[str, torch.nn.Parameter]]) -> tuple[list, list]:
    """(Muon's parameters, AdamW's): the 2-D weights of the hidden layers, and everything else."""
    muon, adamw = [], []
    for name, param in named:
        hidden = param.ndim == 2 and not any(part in name for part in ADAMW_ONLY)
        (muon if hidden else adamw).append(param)
    return muon, adamw


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon and torch.optim.AdamW stepped as one optimizer: one object for accelerate,
    the learning-rate scheduler (it scales every group's rate, each from its own base) and the
    checkpoints (the state dict holds both halves)."""

    def __init__(self, named: Iterable[tuple[str, torch.nn.Parameter]], lr: float, muon_lr: float | None,
                 weight_decay: float, betas: tuple[float, float], momentum: float) -> None:  # fmt: skip
        muon, adamw = muon_split(named)
        if not muon:
            from headstart.errors import HeadstartError

            raise HeadstartError(
                "optim.name=muon: the head has no hidden 2-D weights for Muon", "set optim.name=adamw"
            )
        self.muon = torch.optim.Muon(
            muon, lr=lr if muon_lr is None else muon_lr, weight_decay=weight_decay, momentum=momentum,
            adjust_lr_fn="match_rms_adamw",
        )  # fmt: skip
        self.halves: list[torch.optim.Optimizer] = [self.muon]
        if adamw:
            self.adamw = torch.optim.AdamW(adamw, lr=lr, weight_decay=weight_decay, betas=betas)
            self.halves.append(self.adamw)
        super().__init__(muon + adamw, {"lr": lr})
        self._share_groups()

    def _share_groups(self) -> None:
        # the halves' own group dicts: a rate the scheduler sets is the rate they step with
        self.param_groups = [group for half in self.halves for group in half.param_groups]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for half in self.halves:
            half.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for half in self.halves:
            half.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"halves": [half.state_dict() for half in self.halves]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        for half, state in zip(self.halves, state_dict["halves"], strict=True):
            half.load_state_dict(state)
        self._share_groups()

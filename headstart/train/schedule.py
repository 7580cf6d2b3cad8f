"""Warmup-stable-decay (WSD): the learning-rate schedule a run can be extended under.

Cosine and linear tie the whole curve to max_steps: a run that learns it has more time (another
GPU window) must restart its schedule. WSD holds the peak rate after the warm-up, and only the
last stretch decays (linearly, to 0), so the plateau can go on as long as there is compute and a
snapshot is released by decaying briefly (Hu et al. 2024, MiniCPM; Hagele et al. 2024, "Scaling
Laws and Compute-Optimal Training Beyond Fixed Training Durations": a 10-20% decay matches cosine).

Where the decay starts: `optim.decay` of max_steps before it, or, under a time budget, when the
budget's training time left is `optim.decay` of the whole, with as many decay steps as the
measured pace fits into what is left (`start_decay`); that choice is part of the scheduler's
state, so `--resume` continues the same decay.
"""

from __future__ import annotations

from typing import Any

import torch


class WarmupStableDecay(torch.optim.lr_scheduler.LRScheduler):
    def __init__(
        self, optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int, decay: float
    ) -> None:
        self.warmup_steps, self.max_steps, self.decay = warmup_steps, max(1, max_steps), decay
        self.decay_steps = max(1, round(decay * self.max_steps)) if decay > 0 else 0
        self.decay_start = self.max_steps - self.decay_steps
        self.timed = False  # the decay was placed by the time budget (start_decay), not by max_steps
        super().__init__(optimizer)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps  # as transformers warms up (0 at the first step)
        if self.decay_steps == 0 or step < self.decay_start:
            return 1.0
        return max(0.0, 1.0 - (step - self.decay_start) / self.decay_steps)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        return [base * self.factor(self.last_epoch) for base in self.base_lrs]

    @property
    def end_step(self) -> int:
        """The step at which the decay reaches 0: the run's last step."""
        return min(self.max_steps, self.decay_start + self.decay_steps) if self.timed else self.max_steps

    @property
    def decaying(self) -> bool:
        return self.decay_steps > 0 and self.last_epoch >= self.decay_start

    def start_decay(self, step: int, steps: int) -> None:
        """Decay from `step` (the next step's rate) to 0 over `steps` steps (the time budget's
        call: the steps its measured pace fits into the time left)."""
        self.decay_start, self.decay_steps, self.timed = step, max(1, min(steps, self.max_steps - step)), True
        self.last_epoch -= 1  # recompute the rate of the step to come under the new decay
        self.step()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed run keeps a decay the time budget placed; one that max_steps placed follows
        the resumed command's max_steps (`--resume max_steps=MORE` extends the plateau)."""
        mine = {
            k: getattr(self, k) for k in ("warmup_steps", "max_steps", "decay", "decay_steps", "decay_start")
        }
        super().load_state_dict(state_dict)
        if not state_dict.get("timed"):
            self.__dict__.update(mine)
        else:
            self.max_steps, self.warmup_steps = mine["max_steps"], mine["warmup_steps"]
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr

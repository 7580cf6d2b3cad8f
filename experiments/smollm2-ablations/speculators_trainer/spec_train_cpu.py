#!/usr/bin/env python
"""`speculators train` (0.9.0) on a CPU-only machine: the same entry point the CLI uses
(speculators/cli/train.py: main(TrainConfig.resolve(argv))) with three shims, and nothing in the
training math changed:

  1. device: Trainer puts the model and every batch on `self.local_rank` (an int, 0:
     speculators/train/trainer.py:221, 348, 533, 643), which torch 2.13 resolves to the current
     accelerator -> "RuntimeError: Cannot access accelerator device when none is available." on a
     CPU-only torch. We make trainer.get_local_rank() return "cpu".
  2. timing: _StepTimer.mark/now call torch.accelerator.synchronize() on every logged step
     (trainer.py:80, 92), which raises the same error without an accelerator: a no-op on CPU.
  3. logging: the metric dicts speculators logs per step ("speculators.metrics" logger,
     trainer.py:587) also go to a JSON-lines file ($SPEC_METRICS) with a wall-clock stamp, so the
     loss curve and the step times can be read back without parsing rich console output.

Threads: torch.set_num_threads($SPEC_THREADS, default 1) before anything runs.

    SPEC_THREADS=1 SPEC_METRICS=run/metrics.jsonl python spec_train_cpu.py <speculators train flags>
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("SPEC_THREADS", "1")))

if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda *a, **k: None  # shim 2

import speculators.train.cli as spec_cli  # noqa: E402
import speculators.train.trainer as spec_trainer  # noqa: E402
from speculators.train.config import TrainConfig  # noqa: E402

if not torch.accelerator.is_available():
    spec_trainer.get_local_rank = lambda: "cpu"  # shim 1


class JsonLines(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.out = open(path, "a", buffering=1)  # noqa: SIM115

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and not getattr(record, "hparams", False):
            self.out.write(json.dumps({"time": time.time(), **record.msg}, default=str) + "\n")


_setup = spec_cli.setup_metric_logger


def setup_metric_logger(*args, **kwargs) -> None:  # shim 3: after speculators' own dictConfig
    _setup(*args, **kwargs)
    path = os.environ.get("SPEC_METRICS")
    if path:
        logging.getLogger("speculators.metrics").addHandler(JsonLines(path))


spec_cli.setup_metric_logger = setup_metric_logger

if __name__ == "__main__":
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, accelerator "
          f"{torch.accelerator.current_accelerator()}", flush=True)  # fmt: skip
    started = time.time()
    spec_cli.main(TrainConfig.resolve(sys.argv[1:]))
    print(
        f"speculators train: wall {time.time() - started:.1f} s (from config resolution to exit)", flush=True
    )
